"""LiteRT: conversion to .tflite, the .tflite file itself (metadata, census, truncation), and the GPU
accelerator.
"""
