"""A checkpoint at clef-flash's exact widths with random weights: the pipeline proven at real scale.

It is the embedded tiny checkpoint (scripts/checkpoint/tiny_checkpoint.py) grown to clef-flash's widths: hidden
4096, SwiGLU 12288, GatedDeltaNet 16 key / 32 value heads of 128 with conv 4, attention 16 q / 4 kv
heads of 256 with the output gate, the same rope. Two things stay small on purpose: the layer count
(model.synthetic_layers; 4 = three GatedDeltaNet layers and one attention layer, clef-flash's 3:1
pattern) and the vocabulary (the tiny byte-level tokenizer's 320 tokens), so the weights are the text
stack's and the row graph is what one slice of the real model costs.
The weights are drawn as the tiny checkpoint's are (tiny._draw), projections rescaled to the fan-in
(PROJECTION_GAIN): so it keeps the same memory design (even GatedDeltaNet heads decay slowly, odd
heads fast, in_proj_a at its own 0.3 / sqrt(fan-in)) and massive activations in 3 of the 4096
channels at every 16th token id.
Each decoder layer gets its own shard, generated and written one at a time, so making the ~1.7 GB
of bf16 never holds more than one layer in memory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from scripts.checkpoint import tiny_checkpoint as tiny
from scripts.pipeline.mappings import ForeignJson
from scripts.qwen35.checkpoint_layout import EMBED_TOKENS, TEXT_PREFIX

REPO = "clef-litert/clef-flash-synthetic"

# clef-flash's text stack (its config.json at the pinned revision); vocab and layer count set below.
REAL_WIDTHS = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "rope_parameters": {**tiny.TEXT_CONFIG["rope_parameters"], "mrope_section": [11, 11, 10]},
}
# The tiny checkpoint draws projections with std 0.2 at fan-in 128. Keeping std x sqrt(fan_in) at
# that value keeps each projection's output scale what it is in the tiny model; a fixed 0.2 at
# fan-in 12288 would grow activations ~10x per layer and overflow the checks' fp32 references.
PROJECTION_GAIN = tiny.PROJECTION_STD * math.sqrt(tiny.TEXT_CONFIG["hidden_size"])


def text_config(layers: int) -> ForeignJson:
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"layers must be a positive integer, got {layers!r}")
    kinds = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return {**tiny.TEXT_CONFIG, **REAL_WIDTHS, "num_hidden_layers": layers, "layer_types": kinds}


def projection_std(shape: tuple[int, ...]) -> float:
    """std for a weight of `shape`: gain / sqrt(fan-in) for a Linear, the tiny std otherwise
    (tiny._draw ignores it where a tensor has its own scale: in_proj_a, norms, A_log, dt_bias)."""
    return PROJECTION_GAIN / math.sqrt(shape[1]) if len(shape) == 2 else tiny.PROJECTION_STD


def shard_groups(names: list[str], layers: int) -> list[list[str]]:
    """One shard per decoder layer, then one for everything else (embeddings, norm, lm_head, vision, MTP)."""
    groups = [[n for n in names if n.startswith(f"{TEXT_PREFIX}layers.{i}.")] for i in range(layers)]
    placed = {n for g in groups for n in g}
    return groups + [[n for n in names if n not in placed]]


def write(target: Path, layers: int) -> str:
    """Write the snapshot files into directory `target` (created); -> the revision naming its content
    (the sha1 of every file's name and sha256, like the tiny checkpoint's)."""
    from safetensors.torch import save_file

    from scripts.checkpoint.snapshot import sha256_file

    cfg = tiny.config(text_config(layers))
    sizes = tiny.shapes(cfg)
    groups = shard_groups(sorted(sizes), layers)
    target = Path(target)
    target.mkdir(parents=True)
    files = {"config.json": tiny.json_bytes(cfg), **tiny.tokenizer_files()}
    for name, data in files.items():
        (target / name).write_bytes(data)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        weights = {k: tiny._draw(k, sizes[k], projection_std(sizes[k])).to(torch.bfloat16).contiguous() for k in group}
        save_file(weights, str(target / shard), metadata={"format": "pt"})
        total += sum(w.numel() * w.element_size() for w in weights.values())
        weight_map.update({k: shard for k in group})
        del weights
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_bytes(tiny.json_bytes(index))
    return tiny.revision_of_digests({p.name: sha256_file(p) for p in target.iterdir()})


def fp32_text_bytes(layers: int) -> int:
    """The fp32 bytes of the text stack the pipeline builds (embed_tokens excluded: the host's)."""
    cfg = tiny.config(text_config(layers))
    return 4 * sum(math.prod(s) for k, s in tiny.shapes(cfg).items() if k.startswith(TEXT_PREFIX) and k != EMBED_TOKENS)


if __name__ == "__main__":  # python -m scripts.checkpoint.synthetic_checkpoint: the sizes, without writing
    for n in (4, 32):
        print(json.dumps({"layers": n, "fp32_text_stack_bytes": fp32_text_bytes(n)}))
