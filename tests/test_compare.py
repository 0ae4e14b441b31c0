"""The one error metric (scripts/checks/compare.py), and every stage's comparison failing on a NaN."""

from __future__ import annotations

import math

import pytest
import torch

from scripts.checks import compare, gpu_check, kernel_check, model_check, pair_check, tflite_check
from scripts.layers import gated_delta
from scripts.pipeline import params
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import pair_graph, patch, text_stack
from scripts.qwen35.host import Host, PairRunner
from scripts.qwen35.row_graph import ClefRowPrefill
from scripts.release import reader, references

FORM = "R64+sp+ec+dd+vs6"


def test_nan_or_inf_on_either_side_fails_naming_the_key():
    ref = torch.ones(1, 4, 8)
    bad = ref.clone()
    bad[0, 2, 3] = float("nan")
    out = compare.figures("vs_x", bad, ref)
    assert out["rel_vs_x"] == math.inf and out["rel_per_position_vs_x"] == math.inf
    inf = ref.clone()
    inf[0, 1, 0] = float("inf")
    assert compare.figures("vs_x", ref, inf)["rel_vs_x"] != compare.figures("vs_x", ref, inf)["rel_vs_x"]  # NaN
    lines = compare.judge(
        [{"check": "c", **out}, {"check": "d", **compare.figures("vs_x", ref, inf)}],
        {"rel_vs_x": 1.0, "rel_per_position_vs_x": 1.0},
    )
    assert lines[0] == "check=c: rel_vs_x is inf (NaN or inf in the output)"
    assert "check=d: rel_vs_x is nan (NaN or inf in the reference)" in lines and len(lines) == 4


def test_a_bound_is_broken_by_nan_and_by_a_missing_figure_never_passed():
    assert compare.exceeds(float("nan"), 1.0) and compare.exceeds(None, 1.0) and compare.exceeds(2.0, 1.0)
    assert not compare.exceeds(1.0, 1.0)
    assert math.isnan(compare.largest([1.0, float("nan"), 3.0]))  # Python's max would return 3.0 here


def test_per_position_sees_an_ordinary_position_next_to_a_massive_one():
    ref = torch.ones(1, 3, 4)
    ref[0, 0] = 1000.0  # a massive-activation position dominates the global figure
    out = ref.clone()
    out[0, 2] += 0.5
    fig = compare.figures("vs_x", out, ref)
    assert fig["rel_vs_x"] < 1e-3 and fig["rel_per_position_vs_x"] == pytest.approx(0.5)
    assert compare.rel_per_position(out.transpose(1, 2), ref.transpose(1, 2), position_dim=-1)[2] == pytest.approx(0.5)
    with pytest.raises(ClefError, match="shapes"):
        compare.figures("vs_x", out[:, :2], ref)


@pytest.mark.parametrize(
    "section, fragment",
    [
        ({"max_a": 0}, "verify_x.max_a 0 is not a positive number"),
        ({"max_a": True}, "verify_x.max_a True"),
        ({"max_a": float("inf")}, "verify_x.max_a inf"),
        ({}, "verify_x.max_a None"),
        ([1], "must be a mapping"),
    ],
)
def test_bounds_must_be_positive_numbers(section, fragment):
    with pytest.raises(ClefError, match="params.yaml") as info:
        params.positive_numbers(section, ("max_a",), "verify_x")
    assert fragment in str(info.value)


# ---- a NaN fed into every stage's comparison --------------------------------------------------


def nan_at_one_position(kernel):
    """A kernel wrapper whose output carries a NaN at token 3 (everything else exact)."""

    def wrapped(*args, **kwargs):
        out, state = kernel(*args, **kwargs)
        out = out.clone()
        out[:, 3] = float("nan")
        return out, state

    wrapped.form = kernel.form
    return wrapped


@pytest.fixture
def nan_kernel(monkeypatch):
    make = gated_delta.make_kernel

    def make_nan(form, carry_state=True):  # the configured form only: the float64 references stay exact
        kernel = make(form, carry_state)
        return nan_at_one_position(kernel) if str(form) == FORM else kernel

    monkeypatch.setattr(gated_delta, "make_kernel", make_nan)


def judged(rows, stage_keys):
    lines = compare.judge(rows, {k: 1.0 for k in stage_keys})
    assert lines and all(("is inf" in ln or "is nan" in ln or "not finite" in ln) for ln in lines), lines
    return lines


def test_verify_kernel_fails_on_nan(nan_kernel, monkeypatch):
    monkeypatch.setattr(kernel_check, "REGIMES", ("weak_decay",))
    monkeypatch.setattr(kernel_check, "LENGTHS", (130,))
    rows = kernel_check.check({"k": 2, "v": 4, "k_dim": 32, "v_dim": 32}, [FORM])
    summary = kernel_check.summarize(rows, FORM, {"rel_vs_f64": 1e-5, "rel_per_position_vs_f64": 1e-4}, 100)
    assert not summary["passed"] and any("rel_vs_f64 is inf" in ln for ln in summary["failures"]), summary["failures"]


def test_verify_layers_fails_on_nan(nan_kernel, tiny_snapshot):
    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    rows = model_check.layer_rows(model, FORM, seeds=(5,), scales=(1.0,))
    lines = model_check.failures(rows, {"rel_vs_stock_f64": 1e-5, "rel_per_position_vs_stock_f64": 1e-4})
    assert any("rel_per_position_vs_stock_f64 is inf" in ln for ln in lines), lines


def test_verify_model_fails_on_nan(nan_kernel, tiny_snapshot):
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    rows = model_check.model_rows(model, Host(tiny_snapshot), [64], model.config.vocab_size)
    lines = model_check.failures(rows, {"rel_vs_stock_f64": 1e-4, "rel_causality": 1e-6})
    assert any("check=vs_stock, L=64, record=full: rel_vs_stock_f64 is inf" in ln for ln in lines), lines


@pytest.fixture(scope="module")
def patched(tiny_snapshot):
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    return model, Host(tiny_snapshot)


def test_verify_tflite_fails_on_nan(patched):
    model, host = patched
    inputs = host.record(list(range(10, 74)), 64)
    lite = ClefRowPrefill(model, 64)(**inputs)["hidden"].detach().clone()
    lite[0, 5, 0] = float("nan")  # what the interpreter returned
    reference = tflite_check.torch_reference(ClefRowPrefill(model, 64).eval(), inputs, 64, FORM)
    row = tflite_check.record_row("full", 64, lite, reference)
    judged([row], ["rel_vs_torch", "rel_per_position_vs_torch"])


def torch_fn(module, poison=False):
    def call(**inputs):
        with torch.no_grad():
            out = dict(module(**inputs))
        if poison:
            out["hidden"] = out["hidden"].clone()
            out["hidden"][0, 0, 0] = float("nan")
        return out

    return call


def test_verify_pair_fails_on_nan(patched):
    model, host = patched
    P, S = 64, 16
    runner = PairRunner(
        host,
        torch_fn(pair_graph.PairPrefix(model, P).eval()),
        torch_fn(pair_graph.PairSuffix(model, P, S).eval(), poison=True),
        P,
        S,
        FORM,
        pair_graph.state_shapes(model, P),
    )
    rows = pair_check.chaining(runner, pair_check.References(model, host, P, S), model.config.vocab_size, seed=1)
    lines = judged([r for r in rows if r["check"] == "chaining"], ["rel_vs_row", "rel_per_position_vs_row"])
    assert any("check=chaining, p=64, s=16: rel_vs_row is inf" in ln for ln in lines), lines


def poisoned_run(graph):
    """Stands in for a GPU mode whose every output holds a NaN (no adapter needed)."""
    return lambda signature, feeds: [torch_fn(graph, poison=True)(**f) for f in feeds]


def test_verify_gpu_fails_on_nan(patched):
    model, host = patched
    graph = ClefRowPrefill(model, 64).eval()
    records = {"full": (64, host.record(list(range(10, 74)), 64))}
    refs = gpu_check.row_references(model, host, gpu_check.StockReferences(model), records)
    rows = gpu_check.row_rows({"fp32": poisoned_run(graph), "fp16": poisoned_run(graph)}, refs, records)
    _, problems = gpu_check.summary(
        rows, {"max_rel_fp32": 1e-4, "max_rel_per_position_fp32": 1e-4, "fp16_max_over_floor": 2.0}
    )
    assert "mode=fp32, record=full: rel_vs_torch is inf (NaN or inf in the output)" in problems, problems
    assert "mode=fp16, record=full: an output is not finite" in problems, problems


def test_clef_verify_fails_on_nan(patched):
    model, host = patched
    inputs = host.record(list(range(10, 30)), 64)
    with torch.no_grad():
        expected = ClefRowPrefill(model, 64)(**inputs)["hidden"][:, :20]
    record = {**inputs, "expected": expected}
    graph = ClefRowPrefill(model, 64).eval()
    figures = references.reference_error(lambda name: torch_fn(graph, poison=True), "row", record)
    lines = reader.reference_problems(figures, {"threshold": 1e-4, "threshold_per_position": 1e-4})
    assert lines == [
        "rel_vs_expected is inf (NaN or inf in the output)",
        "rel_per_position_vs_expected is inf (NaN or inf in the output)",
    ]
    good = references.reference_error(lambda name: torch_fn(graph), "row", record)
    assert reader.reference_problems(good, {"threshold": 1e-4, "threshold_per_position": 1e-4}) == []
