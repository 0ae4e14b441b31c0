"""Qwen3.5, clef-flash's architecture: the fp32 text stack from the snapshot, the patch that puts a
kernel form in, the row and pair graphs, and the host side (embeddings, M-RoPE tables, lm_head).
"""
