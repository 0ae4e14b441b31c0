"""The fp32 text stack loader: what it skips, what it yields, and that it is the stock model's stack."""

from __future__ import annotations

import json

import pytest
import torch

from scripts.pipeline.errors import ClefError
from scripts.qwen35 import text_stack


@pytest.fixture(scope="module")
def stack(tiny_snapshot):
    return text_stack.load_text_stack(tiny_snapshot, progress=False)


def test_skips_vision_mtp_and_embeddings_and_yields_float32(stack, tiny_snapshot):
    model, info = stack
    wmap = json.loads((tiny_snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    text_keys = [k for k in wmap if k.startswith(text_stack.PREFIX) and not k.endswith("embed_tokens.weight")]
    assert info["tensors"] == len(text_keys) == len(model.state_dict())
    assert model.embed_tokens is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert info["source_dtypes"] == ["torch.bfloat16"]
    assert not any("visual" in k or "mtp" in k for k in model.state_dict())
    assert info["fp32_bytes"] == 4 * info["params"]


def test_structure_comes_from_the_config(stack, tiny_snapshot):
    _, info = stack
    cfg = json.loads((tiny_snapshot / "config.json").read_text())["text_config"]
    assert info["layers"] == cfg["num_hidden_layers"]
    assert info["attention_layers"] == [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    assert (
        info["gdn_heads"]["k"] == cfg["linear_num_key_heads"]
        and info["gdn_heads"]["v"] == cfg["linear_num_value_heads"]
    )
    assert info["attention_heads"]["output_gate"] is True


def test_the_description_heads_the_load_facts(stack, tiny_snapshot):
    """describe's record is what the facts (results/stack.json) start with, field for field."""
    model, info = stack
    described = text_stack.describe(model, text_stack.text_config(tiny_snapshot))
    assert described.gdn_heads.ratio == described.gdn_heads.v // described.gdn_heads.k
    assert described.attention_heads.output_gate is True and described.embed_tokens is None
    assert list(info)[: len(described.to_json())] == list(described.to_json())
    assert {k: info[k] for k in described.to_json()} == described.to_json()


def test_a_stack_without_attention_has_no_attention_entry(tiny_snapshot):
    cfg = text_stack.text_config(tiny_snapshot)
    cfg.layer_types = ["linear_attention"] * cfg.num_hidden_layers
    doc = text_stack.describe(text_stack.build_on_meta(cfg), cfg).to_json()
    assert "attention_heads" not in doc and doc["attention_layers"] == []
    assert doc["gdn_heads"]["k"] == cfg.linear_num_key_heads and "embed_tokens" in doc


def test_equals_the_stock_models_text_stack(stack, tiny_snapshot):
    """Our meta-device build with assigned fp32 weights computes what transformers' own load computes."""
    from transformers import Qwen3_5ForConditionalGeneration

    model, _ = stack
    stock = Qwen3_5ForConditionalGeneration.from_pretrained(str(tiny_snapshot), dtype=torch.float32).eval()
    x = torch.randn(1, 40, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(inputs_embeds=x, use_cache=False).last_hidden_state
        theirs = stock.model.language_model(inputs_embeds=x, use_cache=False).last_hidden_state
    assert torch.equal(ours, theirs)


def test_mismatched_tensors_name_first_missing_and_unexpected(tiny_snapshot):
    cfg = text_stack.text_config(tiny_snapshot)
    model = text_stack.build_on_meta(cfg)
    wmap = json.loads((tiny_snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    moved = "model.language_model.layers.1.mlp.up_proj.weight"
    wmap["model.language_model.layers.1.mlp.up_proj_typo.weight"] = wmap.pop(moved)
    with pytest.raises(
        ClefError,
        match=r"1 missing \(first: model\.language_model\.layers\.1\.mlp\.up_proj\.weight\), "
        r"1 unexpected \(first: .*up_proj_typo\.weight\)",
    ):
        text_stack.keys_by_shard(model, wmap)
