"""The checks: the one error metric, the faults that prove each check can fail, and the kernel,
model, pair, .tflite and GPU comparisons.
"""
