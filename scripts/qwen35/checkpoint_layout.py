"""Facts of the Qwen3.5 checkpoint layout that several modules read: where the text stack's tensors
live in the safetensors names, and how wide the rotary tables are."""

from __future__ import annotations

# Every text-stack tensor's name starts with this (vision and MTP tensors do not).
TEXT_PREFIX = "model.language_model."
EMBED_TOKENS = TEXT_PREFIX + "embed_tokens.weight"  # the host's table, not part of any graph
LM_HEAD = "lm_head.weight"


def rotary_width(head_dim: int, rope_parameters: dict) -> int:
    """R = head_dim x partial_rotary_factor: the width of the cos/sin tables (M-RoPE rotates part of each head)."""
    return int(head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
