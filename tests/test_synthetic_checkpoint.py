"""The real-width synthetic checkpoint: clef-flash's widths in the tiny checkpoint's layout.

One decoder layer is written (a GatedDeltaNet one: ~0.4 GB of bf16); the widths are checked against
clef-flash's published facts (its config.json and the hub's file list), not against the module's own constants."""

from __future__ import annotations

import json

import pytest

from scripts.checkpoint import synthetic_checkpoint
from scripts.pipeline import params
from scripts.pipeline.errors import ClefError


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    target = tmp_path_factory.mktemp("synthetic") / "snapshot"
    return target, synthetic_checkpoint.write(target, 1)


def test_widths_are_clef_flash(one_layer):
    target, revision = one_layer
    text = json.loads((target / "config.json").read_text())["text_config"]
    assert (text["hidden_size"], text["intermediate_size"]) == (4096, 12288)
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"], text["linear_key_head_dim"]) == (16, 32, 128)
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (16, 4, 256)
    assert text["rope_parameters"]["mrope_section"] == [11, 11, 10] and text["attn_output_gate"]
    assert len(revision) == 40 and int(revision, 16) >= 0


def test_every_key_in_the_index_is_in_its_shard_as_bf16(one_layer):
    from safetensors import safe_open

    target, _ = one_layer
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) == 2  # one per decoder layer, one for the rest
    found = {}
    for shard in shards:
        with safe_open(str(target / shard), framework="pt") as f:
            found.update({k: (shard, f.get_slice(k).get_dtype()) for k in f.keys()})
    assert {k: s for k, (s, _) in found.items()} == index
    assert {d for _, d in found.values()} == {"BF16"}
    with safe_open(str(target / index["model.language_model.layers.0.mlp.down_proj.weight"]), framework="pt") as f:
        down = f.get_tensor("model.language_model.layers.0.mlp.down_proj.weight").float()
    assert down.shape == (4096, 12288)
    # std x sqrt(fan-in) is the tiny checkpoint's 0.2 x sqrt(128): outputs keep the tiny scale
    assert abs(down.std().item() * 12288**0.5 / synthetic_checkpoint.PROJECTION_GAIN - 1) < 0.01


def test_layer_pattern_and_full_size():
    kinds = synthetic_checkpoint.text_config(8)["layer_types"]
    assert kinds == (["linear_attention"] * 3 + ["full_attention"]) * 2
    # clef-flash's fp32 text stack without embed_tokens is ~27.7 GB
    assert abs(synthetic_checkpoint.fp32_text_bytes(32) / 27.7e9 - 1) < 0.01


@pytest.mark.parametrize("layers", [0, -1, "4", True, None])
def test_bad_layer_count_refused(layers):
    model = {"source": "synthetic", "repo": "a/b", "revision": "0" * 40, "synthetic_layers": layers}
    with pytest.raises(ClefError, match="synthetic_layers"):
        params.check_section({"model": model}, "model")


def test_layer_count_ignored_for_other_sources():
    params.check_section({"model": {"source": "tiny", "repo": "a/b", "revision": "0" * 40}}, "model")


def test_gated_deltanet_keeps_memory_at_real_width(one_layer):
    """The tiny checkpoint's memory design at clef-flash's widths (32 value heads, fan-in 4096),
    measured through stock transformers: at least half the heads keep >= 10% of their state over
    64 tokens, the even ones. in_proj_a has its own std 0.3 / sqrt(fan-in), not the projections'."""
    from safetensors import safe_open

    from scripts.checkpoint import tiny_checkpoint
    from scripts.qwen35 import text_stack
    from tests.test_tiny_checkpoint import KEPT, chunk_survival, heads_keeping_memory, record_embeds

    target, _ = one_layer
    key = "model.language_model.layers.0.linear_attn.in_proj_a.weight"
    shard = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"][key]
    with safe_open(str(target / shard), framework="pt") as f:
        a = f.get_tensor(key).float()
    assert a.shape == (32, 4096)
    assert abs(a.std().item() * 4096**0.5 / tiny_checkpoint.IN_PROJ_A_GAIN - 1) < 0.05
    model, _ = text_stack.load_text_stack(target, progress=False)
    _, embeds = record_embeds(target)
    survival = chunk_survival(model, embeds)
    assert list(survival) == [0] and survival[0].shape == (32,)
    assert heads_keeping_memory(survival)[0] >= 0.5, survival
    assert bool((survival[0][0::2] >= KEPT).all()), survival
