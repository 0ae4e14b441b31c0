"""The patched stack and its row graph: the export graph's rules, the twin, and the pieces that make it."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as M

from scripts.checks import compare, model_check, record_text
from scripts.pipeline import params
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host
from scripts.qwen35.row_graph import ClefRowPrefill, causal_constant
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def patched(tiny_snapshot):
    model, _, applied = patch.load(tiny_snapshot, "R64+sp+ec+dd+vs6", progress=False)
    return model, applied


def test_interleave_is_repeat_interleave():
    x = torch.randn(1, 7, 3, 5)
    assert torch.equal(patch.interleave_heads(x, 2), x.repeat_interleave(2, dim=2))
    assert torch.equal(patch.interleave_heads(x, 4), x.repeat_interleave(4, dim=2))


def test_clef_eager_attention_is_stock_eager():
    class Holder:
        num_key_value_groups = 4
        training = False

    q, k, v = torch.randn(1, 8, 10, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
    mask = causal_constant(10)
    ours, _ = patch.clef_eager_attention(Holder(), q, k, v, mask, scaling=0.25)
    stock, _ = M.eager_attention_forward(Holder(), q, k, v, mask, scaling=0.25)
    assert torch.allclose(ours, stock, atol=1e-6)


def test_patch_switches_classes_not_weights(patched):
    model, applied = patched
    assert type(model) is patch.ClefTextModel
    gdn = [layer.linear_attn for layer in model.layers if layer.block_type == "linear_attention"]
    assert gdn and all(type(m) is patch.ClefGatedDeltaNet for m in gdn)
    assert model.config._attn_implementation == patch.ATTENTION
    assert applied.softplus == "safe" and applied.layers == len(gdn)


def test_stock_twin_shares_storage(patched):
    model, _ = patched
    twin = patch.stock_twin(model)
    ours = dict(model.named_parameters())
    for name, p in twin.named_parameters():
        assert p.data_ptr() == ours[name].data_ptr(), name
    assert type(twin) is M.Qwen3_5TextModel and twin.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == patch.ATTENTION  # the twin's config is its own


def test_export_graph_is_rank4_without_int_arithmetic_or_runtime_ranges(patched, tiny_snapshot):
    """Walks the torch.export graph of the row graph: no value of rank >= 5, no integer arithmetic
    on the data path, no eye/arange/triu/cumsum at run time."""
    model, _ = patched
    length = 64
    inputs = Host(tiny_snapshot).record(list(range(40)), length)
    ep = torch.export.export(ClefRowPrefill(model, length), (), kwargs=inputs)
    bad_rank, int_ops, banned = [], [], []
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor):
                if v.dim() > 4:
                    bad_rank.append((str(node.target), tuple(v.shape)))
                if not v.is_floating_point() and v.dtype != torch.bool:
                    int_ops.append((str(node.target), v.dtype))
        if any(b in str(node.target) for b in ("eye", "arange", "triu", "tril", "cumsum", "iota")):
            banned.append(str(node.target))
    assert bad_rank == [] and int_ops == [] and banned == [], (bad_rank[:5], int_ops[:5], banned[:5])


def test_row_graph_matches_the_stock_twin_and_is_causal(patched, tiny_snapshot):
    """verify_model's checks at L = 64, against params.yaml's bounds, global and per position."""
    model, _ = patched
    p = params.load(["verify_model"], ROOT / "params.yaml")
    rows = model_check.model_rows(model, Host(tiny_snapshot), [64], record_text.RandomIds(model.config.vocab_size))
    limits = params.bounds(p, "verify_model", ("rel_vs_stock_f64", "rel_per_position_vs_stock_f64", "rel_causality"))
    assert model_check.failures(rows, limits) == []
    assert all("rel_per_position_vs_stock_f64" in r for r in rows if r["check"] == "vs_stock")
    vs = [r for r in rows if r["check"] == "vs_stock"]
    assert {r["record"] for r in vs} == {"full", "padded", "one_token"}
    assert all(r["interleave_calls"] == r["interleave_calls_expected"] > 0 for r in vs)
    assert next(model.parameters()).dtype == torch.float32  # the float64 references were copies


def test_the_smallest_length_the_schema_takes_passes_verify_model_and_one_less_is_refused(patched, tiny_snapshot):
    """params.yaml's lengths are held to the records the checks build (scripts/checks/records.py): at the
    smallest L the schema takes, verify_model's every record builds and passes; one token less and the
    check itself refuses, which is what the schema now says first."""
    from scripts.checks import records
    from scripts.pipeline.errors import ClefError

    model, _ = patched
    least = next(n for n in range(1, 64) if records.row_unfit(n) is None)
    p = params.load(["verify_model"], ROOT / "params.yaml")
    limits = params.bounds(p, "verify_model", ("rel_vs_stock_f64", "rel_per_position_vs_stock_f64", "rel_causality"))
    host = Host(tiny_snapshot)
    rows = model_check.model_rows(model, host, [least], record_text.RandomIds(model.config.vocab_size))
    assert model_check.failures(rows, limits) == [] and {r["check"] for r in rows} == {"vs_stock", "causality"}
    with pytest.raises(ClefError, match="do not fit a graph of L="):
        model_check.model_rows(model, host, [least - 1], record_text.RandomIds(model.config.vocab_size))


def test_pad_guard_keeps_the_state_at_the_last_real_token(patched):
    """The GatedDeltaNet's recurrent state after pads equals the state at the last real token
    (what the shared-state pairs rely on): pads carry zero k/v and unit decay."""
    model, _ = patched
    layer = next(decoder.linear_attn for decoder in model.layers if decoder.block_type == "linear_attention")
    seen = []
    kernel = layer.chunk_gated_delta_rule

    def spy(q, k, v, g, beta, **kw):
        seen.append((k, v, g))
        return kernel(q, k, v, g, beta, **kw)

    layer.chunk_gated_delta_rule = spy
    try:
        x = torch.randn(1, 20, model.config.hidden_size)
        valid = torch.ones(1, 20)
        valid[0, 12:] = 0
        with torch.no_grad():
            layer(x, attention_mask=valid)
    finally:
        layer.chunk_gated_delta_rule = kernel
    k, v, g = seen[0]
    assert not k[0, 12:].any() and not v[0, 12:].any()
    assert g[0, 12:].abs().max() < 1e-9 and g[0, :12].abs().min() > 0


def test_rms_norm_is_the_stock_function_and_safe_in_fp16():
    """ClefRMSNorm equals the stock RMSNorm (float64 exactly, fp32 to rounding); computed in fp16 without
    an upcast (as a GPU delegate does), its squares do not overflow where the stock formula's do."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    stock = Qwen3_5RMSNorm(64)
    with torch.no_grad():
        stock.weight.normal_(0.0, 0.1)
    ours = copy.deepcopy(stock)
    ours.__class__ = patch.ClefRMSNorm
    x = torch.randn(3, 5, 64) * torch.tensor([0.01, 1.0, 100.0])[:, None, None]
    x[1, 2, 7] = 2000.0
    with torch.no_grad():
        # (forward casts to float32 even in a float64 module: the norms are compared directly)
        assert compare.rel(patch.ClefRMSNorm._norm(ours, x.double()), Qwen3_5RMSNorm._norm(stock, x.double())) < 1e-14
        assert compare.rel(ours(x), stock(x)) < 1e-6
        assert not ours(torch.zeros(1, 64)).any()  # a zeroed pad row stays zero, not NaN
        half = x.half()
        truth = stock._norm(x.double())
        assert compare.figures("vs", patch.ClefRMSNorm._norm(ours, half), truth)["rel_per_position_vs"] < 2e-3
        stock_half = compare.figures("vs", Qwen3_5RMSNorm._norm(stock, half), truth)
        assert stock_half["rel_per_position_vs"] > 0.5  # the control: the squares overflow


def test_failures_name_the_row():
    rows = [
        {"check": "vs_stock", "L": 64, "record": "padded", "rel_vs_stock_f64": 2e-4, "finite": True},
        {"layer": 2, "seed": 5, "input_scale": 3.0, "rel_vs_stock_f64": 1e-6, "finite": False},
        {
            "check": "vs_stock",
            "L": 128,
            "record": "full",
            "rel_vs_stock_f64": 1e-6,
            "finite": True,
            "interleave_calls": 10,
            "interleave_calls_expected": 12,
        },
    ]
    out = model_check.failures(rows, {"rel_vs_stock_f64": 1e-4})
    assert out == [
        "check=vs_stock, L=64, record=padded: rel_vs_stock_f64 0.0002 > 0.0001",
        "layer=2, seed=5, input_scale=3.0: an output is not finite",
        "check=vs_stock, L=128, record=full: 10 interleave calls, expected 12",
    ]


def test_the_row_contract_is_the_json_every_row_graph_embeds(patched):
    """The contract is a record; the JSON a row graph's metadata holds is byte for byte what the dict it
    replaced wrote (the pin is that dict's sha256 at this model and form), key order included."""
    doc = row_graph.contract(patched[0].config, 64, "R64+sp+ec+dd+vs6").to_json()
    assert list(doc) == "graph version L form inputs outputs attention_mask pad_guard state_io".split()
    assert [list(t) for t in doc["inputs"] + doc["outputs"]] == [["name", "shape", "dtype", "meaning"]] * 5
    pinned = "36f12761e2e4b971130302079eb1bc55e87a47a537e710d3affbdaffb0d0144f"
    assert hashlib.sha256(json.dumps(doc).encode()).hexdigest() == pinned
