"""verify_tflite's judging (scripts/checks/tflite_verification.py): the record's keys in the order it
has always had them, an error over a bound and a memory-cut control too weak to break it each a problem."""

from __future__ import annotations

from pathlib import Path

from scripts.checks import tflite_check, tflite_verification
from scripts.checks.decision import DecisionBounds, DecisionFigures
from scripts.checks.decision_check import DecisionRecord
from scripts.checks.quantization_effect import QuantizationRow
from scripts.checks.tflite_verification import TfliteFindings
from scripts.layers.weight_precision import Applied
from scripts.release.references import ReferenceFigures

LIMITS = {"rel_vs_torch": 1e-4, "rel_per_position_vs_torch": 1e-4}
CENSUS = {"op_total": 10, "max_rank": 4, "ops_per_gdn_layer": {"0": 5, "1": 6}}
EFFECT = [QuantizationRow("full", 8, 1e-3, 2e-3, 1.0, 1.0, 0.0)]
TIMING = tflite_check.latency([0.002], [0.004], 1)
KEYS = [
    "L",
    "form",
    "file",
    "bytes",
    "thresholds",
    "passed",
    "problems",
    "rows",
    "max_rel_vs_torch",
    "max_rel_per_position_vs_torch",
    "weights",
    "quantization_effect",
    "control_memory_cut",
    "census",
    "metadata",
    "reference_record",
    "latency",
    "no_decision",
]


REFERENCE = ReferenceFigures("0" * 64, 1e-6, 2e-6, [1e-6, 2e-6])


def findings(tmp_path: Path, rel: float, control: float | None, decision=None) -> TfliteFindings:
    graph = tmp_path / "row_L8.tflite"
    graph.write_bytes(b"\0" * 12)
    row = {"record": "full", "rel_vs_torch": rel, "rel_per_position_vs_torch": rel, "finite": True}
    if control is not None:
        row["control_memory_cut_rel_vs_torch"] = control
    applied = Applied("fp16", 2, 100, 50, 1e-3)
    return TfliteFindings(
        graph,
        "R64",
        "fp16",
        CENSUS,
        {},
        [],
        [row],
        REFERENCE,
        length=8,
        applied=applied,
        effect=EFFECT,
        timing=TIMING,
        decision=decision,
    )


def test_a_passing_graph_keeps_the_records_keys_and_figures(tmp_path):
    result = tflite_verification.result(findings(tmp_path, 1e-6, 1.0), LIMITS, 10.0)
    assert list(result.record) == KEYS and result.passed and result.record["bytes"] == 12
    assert result.record["weights"]["precision"] == "fp16"
    assert result.record["control_memory_cut"]["over_threshold"] == 1.0 / 1e-4
    assert result.figures["ops_per_gdn_layer"] == 6 and result.figures["litert_ms"] == 2.0
    assert result.record_path == Path("results/tflite_L8.json")


def test_the_latency_record_holds_a_budget_only_when_one_was_set():
    """results/tflite_L{L}.json `latency`: the keys the dict had, `budget_seconds` only when set."""
    assert TIMING.to_json() == {
        "litert_median_s": 0.002,
        "torch_median_s": 0.004,
        "torch_over_litert": 2.0,
        "repeats": 1,
        "timed_runs": {"litert": 1, "torch": 1},
    }
    budgeted = tflite_check.latency([0.002, 0.003], [0.004], 5, 30.0).to_json()
    assert budgeted["budget_seconds"] == 30.0 and budgeted["timed_runs"] == {"litert": 2, "torch": 1}
    assert tflite_check.Latency.from_json(budgeted, "latency") == tflite_check.latency([0.002, 0.003], [0.004], 5, 30.0)


def test_no_memory_cut_record_is_recorded_as_not_applying(tmp_path):
    result = tflite_verification.result(findings(tmp_path, 1e-6, None), LIMITS, 10.0)
    assert result.passed and result.record["control_memory_cut"]["applies"] is False
    assert "memory-cut control n/a" in result.lines[0]


def test_an_error_over_its_bound_or_a_weak_control_fails(tmp_path):
    over = tflite_verification.result(findings(tmp_path, 2e-4, 1.0), LIMITS, 10.0)
    assert not over.passed and over.problems[0].startswith("accuracy: ")
    weak = tflite_verification.result(findings(tmp_path, 1e-6, 5e-4), LIMITS, 10.0)
    assert [p.split(":")[0] for p in weak.problems] == ["control memory_cut"]


def test_a_record_row_keeps_its_keys_and_holds_the_control_only_where_it_applies():
    import torch

    hidden = torch.ones(3, 4)
    lite = torch.ones(1, 5, 4)
    row = tflite_check.record_row("padded", 3, lite, tflite_check.TorchReference(hidden, None)).to_json()
    assert list(row) == ["record", "n_real", "rel_vs_torch", "rel_per_position_vs_torch", "finite"]
    assert row["rel_vs_torch"] == 0.0 and row["finite"] is True
    cut = tflite_check.TorchReference(hidden, 2 * hidden)
    assert tflite_check.record_row("padded", 3, lite, cut).to_json()["control_memory_cut_rel_vs_torch"] == 0.5


def decision_record(cpu_kld: float, enforced: list[str]) -> DecisionRecord:
    exact = DecisionBounds(1e-6, 0.999)
    f = dict(scored_tokens=16, kld_mean_err=0.0, kld_median=0.0, kld_p99_9=0.0, kld_p99=0.0, kld_p95=0.0, kld_p90=0.0)
    f.update(kld_p10=0.0, kld_p5=0.0, kld_p1=0.0, kld_max=cpu_kld, same_top=1.0, same_top_err=0.0)
    f.update(rms_delta_p=0.0, rms_delta_p_err=0.0, ln_ppl_ratio=0.0, ln_ppl_ratio_err=0.0, ppl_truth=2.0, ppl_graph=2.0)
    places = {"cpu": DecisionFigures(kld_mean=cpu_kld, **f), "torch_float16": DecisionFigures(kld_mean=1e-3, **f)}
    return DecisionRecord(8, "fp16", 2, 16, places, {"cpu": exact}, enforced)


def test_the_decision_figures_are_held_where_enforced_and_recorded_elsewhere(tmp_path):
    """A CPU mean KLD over its bound fails the graph when `cpu` is enforced, and is only recorded otherwise;
    the record keeps the figures and its line says them."""
    held = tflite_verification.result(findings(tmp_path, 1e-6, 1.0, decision_record(2e-6, ["cpu"])), LIMITS, 10.0)
    assert not held.passed and held.problems == ["decision cpu L=8: mean KLD 2e-06 over 16 tokens > 1e-06"]
    assert held.record["decision"]["places"]["cpu"]["kld_mean"] == 2e-6 and "no_decision" not in held.record
    assert "decision on 16 held-out tokens: CPU mean KLD 2.00e-06" in held.lines[0]
    recorded = tflite_verification.result(findings(tmp_path, 1e-6, 1.0, decision_record(2e-6, [])), LIMITS, 10.0)
    assert recorded.passed
    fine = tflite_verification.result(findings(tmp_path, 1e-6, 1.0, decision_record(1e-9, ["cpu"])), LIMITS, 10.0)
    assert fine.passed
    assert DecisionRecord.from_json(fine.record["decision"], "decision") == decision_record(1e-9, ["cpu"])
