"""The one error metric (scripts/checks/compare.py), and every stage's comparison failing on a NaN."""

from __future__ import annotations

import math

import pytest
import torch

from scripts.checks import compare, gpu_check, kernel_check, model_check, pair_check, record_text, tflite_check
from scripts.layers import gated_delta
from scripts.pipeline import params
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import pair_graph, patch, text_stack
from scripts.qwen35.host import Host, PairRunner
from scripts.qwen35.row_graph import ClefRowPrefill
from scripts.release import reader, references
from scripts.release.manifest import Reference

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


# ---- the per-position floor: a nearly cancelling position (compare.POSITION_NORM_FLOOR) ----------------


def cancelling_record(t=11):
    """A linear layer y = x W^T (W [16, 64], seeded) on 32 positions whose output nearly cancels at
    position t: x_t = n + 1e-4 r with W n = 0 and ||n|| like the other inputs. Returns (t, y in fp32 (the
    stock implementation: W and x cast to float32), y in float64 (the truth))."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(16, 64, generator=gen, dtype=torch.float64) / 8
    x = torch.randn(1, 32, 64, generator=gen, dtype=torch.float64)
    null = torch.linalg.svd(w).Vh[16:]  # rows spanning W's null space
    n = null.T @ torch.randn(48, generator=gen, dtype=torch.float64)
    n = n / n.norm() * x[0].norm(dim=-1).median()
    x[0, t] = n + 1e-4 * torch.randn(64, generator=gen, dtype=torch.float64)
    return t, x.float() @ w.float().T, x @ w.T


def test_a_nearly_cancelling_position_that_stock_fp32_cannot_meet_passes():
    """Guards against a per-position bound that refuses correct work: where one position's output nearly
    cancels, stock fp32 is far from float64 relative to that position's own tiny norm (the rounding of the
    terms that cancel), so an unfloored figure would fail the reference implementation itself."""
    t, y32, y64 = cancelling_record()
    norms = y64[0].norm(dim=-1)
    assert norms[t] < 1e-2 * norms.median()  # the position nearly cancels
    unfloored = float((y32[0, t].double() - y64[0, t]).norm() / norms[t])
    assert unfloored > 1e-4  # stock fp32 cannot meet 1e-4 there by the plain ||diff|| / ||ref||
    fig = compare.figures("vs_f64", y32, y64)
    assert compare.judge([{"check": "stock", **fig}], {"rel_per_position_vs_f64": 1e-4}) == []
    assert fig["rel_per_position_vs_f64"] < 1e-5


def test_an_error_at_an_ordinary_position_still_fails_next_to_a_cancelling_one():
    """Guards against the floor hiding a real error: a 1e-3 relative error injected at an ordinary
    position (norm >= POSITION_NORM_FLOOR x median) keeps its exact relative figure and breaks 1e-4."""
    t, y32, y64 = cancelling_record()
    s = 20
    norms = y64[0].norm(dim=-1)
    assert s != t and norms[s] >= compare.POSITION_NORM_FLOOR * norms.median()  # an ordinary position
    unit = torch.randn(16, generator=torch.Generator().manual_seed(3))
    bad = y32.clone()
    bad[0, s] += 1e-3 * y32[0, s].norm() * unit / unit.norm()
    fig = compare.figures("vs_f64", bad, y64)
    assert fig["rel_per_position_vs_f64"] == pytest.approx(1e-3, rel=0.01)
    assert compare.rel_per_position(bad, y64)[s] == pytest.approx(1e-3, rel=0.01)
    lines = compare.judge([{"check": "injected", **fig}], {"rel_per_position_vs_f64": 1e-4})
    assert len(lines) == 1 and lines[0].startswith("check=injected: rel_per_position_vs_f64 0.001 > 0.0001"), lines


def test_the_floor_keeps_nan_and_inf_failing():
    """Guards against the floor (its median) weakening NaN/inf: a non-finite output at a floored position
    still reports inf, a non-finite reference NaN at its own position only (the median is taken over the
    finite ones, not turned NaN), and an all-zero reference still clamps sanely instead of dividing by 0."""
    t, y32, y64 = cancelling_record()
    for value in (float("nan"), float("inf")):
        bad = y32.clone()
        bad[0, t, 5] = value  # the nearly cancelling, floored position
        per = compare.rel_per_position(bad, y64)
        assert per[t] == math.inf and all(math.isfinite(e) for i, e in enumerate(per) if i != t)
        fig = compare.figures("vs_f64", bad, y64)
        assert fig["rel_vs_f64"] == math.inf and fig["rel_per_position_vs_f64"] == math.inf
        lines = compare.judge([{"check": "c", **fig}], {"rel_per_position_vs_f64": 1e-4})
        assert lines == ["check=c: rel_per_position_vs_f64 is inf (NaN or inf in the output)"]
    ref = y64.clone()
    ref[0, 4, 0] = float("nan")
    per = compare.rel_per_position(y32, ref)
    assert math.isnan(per[4]) and all(e < 1e-5 for i, e in enumerate(per) if i != 4)
    assert math.isnan(compare.figures("vs_f64", y32, ref)["rel_per_position_vs_f64"])
    zero = torch.zeros(1, 3, 4)
    assert compare.rel_per_position(zero, zero) == [0.0, 0.0, 0.0]
    off = zero.clone()
    off[0, 1, 2] = 1e-3
    assert compare.exceeds(compare.figures("vs_x", off, zero)["rel_per_position_vs_x"], 1.0)
    assert compare.rel_per_position(torch.full((1, 1, 4), 2.0), torch.ones(1, 1, 4)) == [1.0]  # one position


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
    assert not summary.passed and any("rel_vs_f64 is inf" in ln for ln in summary.failures), summary.failures


def test_verify_layers_fails_on_nan(nan_kernel, tiny_snapshot):
    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    rows = model_check.layer_rows(model, FORM, seeds=(5,), scales=(1.0,))
    lines = model_check.failures(rows, {"rel_vs_stock_f64": 1e-5, "rel_per_position_vs_stock_f64": 1e-4})
    assert any("rel_per_position_vs_stock_f64 is inf" in ln for ln in lines), lines


def test_verify_model_fails_on_nan(nan_kernel, tiny_snapshot):
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    rows = model_check.model_rows(model, Host(tiny_snapshot), [64], record_text.RandomIds(model.config.vocab_size))
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
    judged([row.to_json()], ["rel_vs_torch", "rel_per_position_vs_torch"])


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
    rows = pair_check.chaining(
        runner, pair_check.References(model, host, P, S), record_text.RandomIds(model.config.vocab_size), seed=1
    )
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
    _, problems = gpu_check.summary(rows, gpu_check.GpuBounds(1e-4, 1e-4, 2.0))
    assert "mode=fp32, record=full: rel_vs_torch is inf (NaN or inf in the output)" in problems, problems
    assert "mode=fp16, record=full: an output is not finite" in problems, problems


def test_clef_verify_fails_on_nan(patched):
    model, host = patched
    inputs = host.record(list(range(10, 30)), 64)
    with torch.no_grad():
        expected = ClefRowPrefill(model, 64)(**inputs)["hidden"][:, :20]
    record = {**inputs, "expected": expected}
    graph = ClefRowPrefill(model, 64).eval()
    figures = references.reference_error(lambda name: torch_fn(graph, poison=True), "row", record).to_json()
    entry = Reference("checks/row_L64.safetensors", 0.0, 1e-4, 0.0, 1e-4, 10, [])  # the manifest's bounds
    lines = reader.reference_problems(figures, entry)
    assert lines == [
        "rel_vs_expected is inf (NaN or inf in the output)",
        "rel_per_position_vs_expected is inf (NaN or inf in the output)",
    ]
    good = references.reference_error(lambda name: torch_fn(graph), "row", record)
    assert reader.reference_problems(good.to_json(), entry) == []
