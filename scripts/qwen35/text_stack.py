"""The fp32 text stack of a Qwen3.5 checkpoint, built so that it is the only copy in memory.

`Qwen3_5TextModel` is built from config.json's `text_config` on the meta device (no storage), then
every `model.language_model.*` tensor except `embed_tokens` (the host's table) is read bf16 ->
float32 and assigned in place (`strict=True, assign=True`). Vision and MTP tensors are skipped.
The structure checks come from the config, never from clef-flash's own numbers, so the same code
holds for the tiny checkpoint and the real one.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scripts.checkpoint.snapshot import read_json, refuse_pickles
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import checkpoint_layout

PREFIX = checkpoint_layout.TEXT_PREFIX
HOST_TENSORS = ("embed_tokens.weight",)  # run on the host, not in the graph


def text_config(snapshot: Path, attn_implementation: str = "sdpa"):
    from transformers import AutoConfig

    from scripts.checkpoint.snapshot import text_config as raw_text_config

    raw_text_config(snapshot)  # an unparsable config.json is one line, not transformers' traceback
    try:
        cfg = AutoConfig.from_pretrained(str(snapshot))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ClefError(
            f"{snapshot}/config.json: transformers cannot read it: {' '.join(str(exc).split())[:300]}"
        ) from None
    text = getattr(cfg, "text_config", None)
    if text is None or getattr(text, "model_type", None) != "qwen3_5_text":
        raise ClefError(f"{snapshot}/config.json is not a Qwen3.5 checkpoint with a qwen3_5_text text_config")
    text._attn_implementation = attn_implementation
    return text


def weight_map(snapshot: Path) -> dict[str, str]:
    """checkpoint key -> shard file, from the safetensors index (or the single model.safetensors)."""
    snapshot = Path(snapshot)
    refuse_pickles(p.name for p in snapshot.iterdir())
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        return read_json(index)["weight_map"]
    single = snapshot / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {k: single.name for k in f.keys()}
    raise ClefError(f"{snapshot} has no safetensors weights (model.safetensors or its index)")


def build_on_meta(cfg, model_cls=None) -> nn.Module:
    """The text model's modules with no storage behind them, embed_tokens removed."""
    if model_cls is None:
        from transformers import Qwen3_5TextModel as model_cls
    with torch.device("meta"):
        model = model_cls(cfg)
    model.embed_tokens = None
    return model


def keys_by_shard(model: nn.Module, wmap: dict[str, str], layers: int | None = None) -> dict[str, list[str]]:
    """{shard: [module key]} for the text stack (layers: only its first `layers` layers' tensors are
    wanted); a mismatch names the first missing and unexpected keys."""
    ckpt = {k[len(PREFIX) :]: shard for k, shard in wmap.items() if k.startswith(PREFIX)}
    for k in HOST_TENSORS:
        ckpt.pop(k, None)
    if layers is not None:
        beyond = re.compile(r"layers\.(\d+)\.")
        ckpt = {k: v for k, v in ckpt.items() if not ((m := beyond.match(k)) and int(m.group(1)) >= layers)}
    wanted = set(model.state_dict())
    missing, unexpected = sorted(wanted - set(ckpt)), sorted(set(ckpt) - wanted)
    if missing or unexpected:
        raise ClefError(
            f"checkpoint tensors do not match the model: {len(missing)} missing (first: "
            f"{PREFIX + missing[0] if missing else None}), {len(unexpected)} unexpected (first: "
            f"{PREFIX + unexpected[0] if unexpected else None})"
        )
    by_shard: dict[str, list[str]] = {}
    for k in sorted(ckpt):
        by_shard.setdefault(ckpt[k], []).append(k)
    return by_shard


def check_structure(model: nn.Module, cfg) -> None:
    """The built stack has the layer kinds and head counts its config declares."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    kinds = [layer.block_type for layer in model.layers]
    if len(model.layers) != cfg.num_hidden_layers or kinds != list(cfg.layer_types):
        raise ClefError(f"the stack's layers {kinds} differ from the config's layer_types {cfg.layer_types}")
    for layer in model.layers:
        mixer = layer.linear_attn if layer.block_type == "linear_attention" else layer.self_attn
        expected = (
            modeling.Qwen3_5GatedDeltaNet if layer.block_type == "linear_attention" else modeling.Qwen3_5Attention
        )
        if not isinstance(mixer, expected):
            raise ClefError(f"{type(mixer).__name__} where the config says {layer.block_type}")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ClefError(
            f"GatedDeltaNet value heads {cfg.linear_num_value_heads} are not a multiple of "
            f"key heads {cfg.linear_num_key_heads}"
        )


def first_block(cfg) -> int:
    """How many layers the stack's first block has: its layers up to and including the first attention
    layer (clef-flash: 3 GatedDeltaNets + 1 attention, the unit its 32 layers repeat)."""
    kinds = list(cfg.layer_types)
    if "full_attention" not in kinds:
        raise ClefError("the config's layer_types have no full_attention layer: the stack has no block")
    return kinds.index("full_attention") + 1


def load_text_stack(
    snapshot: Path, attn_implementation: str = "sdpa", model_cls=None, progress: bool = True, block: bool = False
) -> tuple[nn.Module, dict[str, Any]]:
    """-> (fp32 text model on CPU, eval, no grad, embed_tokens None; the load's facts as a dict: the
    StackDescription's fields, then the tensors read, their dtypes, parameters, fp32 bytes, load time).
    block: only the first block's layers are built and read (first_block), for a per-layer benchmark."""
    from safetensors import safe_open
    from tqdm import tqdm

    from scripts.pipeline.measure import Stopwatch

    snapshot = Path(snapshot)
    clock = Stopwatch()
    cfg = text_config(snapshot, attn_implementation)
    if block:
        n = first_block(cfg)
        cfg.num_hidden_layers, cfg.layer_types = n, list(cfg.layer_types)[:n]
    model = build_on_meta(cfg, model_cls)
    by_shard = keys_by_shard(model, weight_map(snapshot), cfg.num_hidden_layers if block else None)
    state, source_dtypes = {}, set()
    bar = tqdm(sorted(by_shard.items()), desc="loading shards", unit="shard", disable=not progress)
    for shard, keys in bar:
        bar.set_postfix_str(f"{shard} ({len(keys)} tensors)")
        with safe_open(str(snapshot / shard), framework="pt") as f:
            for k in keys:
                t = f.get_tensor(PREFIX + k)
                source_dtypes.add(str(t.dtype))
                state[k] = t.to(torch.float32)
                del t  # the bf16 read is dropped at once: the fp32 copy is the only one kept
    model.load_state_dict(state, strict=True, assign=True)
    n_tensors = len(state)
    del state
    # Non-persistent buffers (rotary inv_freq) are not in the checkpoint: rebuild the module for real.
    model.rotary_emb = type(model.rotary_emb)(config=cfg)
    on_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if on_meta:
        raise ClefError(f"tensors left without data after loading: {on_meta[:5]}")
    model = model.eval().requires_grad_(False)
    check_structure(model, cfg)
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        **describe(model, cfg).to_json(),
        "tensors": n_tensors,
        "source_dtypes": sorted(source_dtypes),
        "params": n_params,
        "fp32_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "load_seconds": clock.seconds(),
    }
    return model, info


@dataclasses.dataclass(frozen=True)
class GdnHeads(Record):
    """The GatedDeltaNet's heads: key and value head counts, their ratio, widths, and conv kernel."""

    k: int
    v: int
    ratio: int
    k_dim: int
    v_dim: int
    conv_kernel: int


@dataclasses.dataclass(frozen=True)
class AttentionHeads(Record):
    """The attention layers' heads: query and key/value counts, width, groups, and the output gate."""

    q: int
    kv: int
    head_dim: int
    num_key_value_groups: int
    output_gate: bool


@dataclasses.dataclass(frozen=True)
class StackDescription(Record):
    """What a built text stack is (`describe`): the head of results/stack.json. A stack without
    GatedDeltaNet (or attention) layers has no entry for their heads and kernel."""

    model_class: str
    layers: int
    gdn_layers: list[int]
    attention_layers: list[int]
    attn_implementation: str
    hidden_size: int
    intermediate_size: int
    final_norm: str
    rope_parameters: dict[str, Any]  # the config's, as transformers holds it
    rms_norm_eps: float
    max_position_embeddings: int
    embed_tokens: None = None  # the host's table (HOST_TENSORS): never in the stack
    gdn_heads: GdnHeads | None = optional()
    chunk_kernel: str | None = optional()
    attention_heads: AttentionHeads | None = optional()


def describe(model: nn.Module, cfg) -> StackDescription:
    """What the stack is, read off the built modules: layer kinds, head counts, norms, kernel."""
    kinds = [layer.block_type for layer in model.layers]
    gdn = [layer.linear_attn for layer in model.layers if layer.block_type == "linear_attention"]
    attn = [layer.self_attn for layer in model.layers if layer.block_type == "full_attention"]
    gdn_heads = chunk_kernel = attention_heads = None
    if gdn:
        g = gdn[0]
        gdn_heads = GdnHeads(
            k=g.num_k_heads,
            v=g.num_v_heads,
            ratio=g.num_v_heads // g.num_k_heads,
            k_dim=g.head_k_dim,
            v_dim=g.head_v_dim,
            conv_kernel=g.conv_kernel_size,
        )
        kernel = g.chunk_gated_delta_rule
        chunk_kernel = getattr(kernel, "__name__", type(kernel).__name__)
    if attn:
        a = attn[0]
        attention_heads = AttentionHeads(
            q=cfg.num_attention_heads,
            kv=cfg.num_key_value_heads,
            head_dim=a.head_dim,
            num_key_value_groups=a.num_key_value_groups,
            output_gate=a.q_proj.out_features == 2 * cfg.num_attention_heads * a.head_dim,
        )
    return StackDescription(
        model_class=type(model).__name__,
        layers=len(model.layers),
        gdn_layers=[i for i, k in enumerate(kinds) if k == "linear_attention"],
        attention_layers=[i for i, k in enumerate(kinds) if k == "full_attention"],
        attn_implementation=cfg._attn_implementation,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        final_norm=type(model.norm).__name__,
        rope_parameters=dict(cfg.rope_parameters),
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        gdn_heads=gdn_heads,
        chunk_kernel=chunk_kernel,
        attention_heads=attention_heads,
    )
