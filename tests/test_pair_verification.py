"""verify_pair's judging (scripts/checks/pair_verification.py): the summary's keys in the order the
record has always had them, a row over a bound and a control too weak to break it each a problem."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from scripts.checks import pair_verification
from scripts.checks.pair_verification import PairFindings, PerBackend
from scripts.pipeline.errors import ClefError
from scripts.release.references import ReferenceFigures

LIMITS = {
    "rel_vs_row": 1e-4,
    "rel_per_position_vs_row": 1e-4,
    "rel_state_vs_stock_f64": 1e-4,
    "rel_per_position_state_vs_stock_f64": 1e-4,
}
CENSUS = {"op_total": 10, "max_rank": 4, "ops_per_gdn_layer": {"0": 5}}


def rows(rel: float = 1e-6, control: float = 1.0) -> list[dict]:
    out = []
    for backend in ("torch", "litert"):
        out += [
            {"backend": backend, "check": "chaining", "rel_vs_row": rel, "rel_per_position_vs_row": rel},
            {"backend": backend, "check": "chaining", "control_zero_state_rel_vs_row": control},
            {"backend": backend, "check": "prefix_hidden", "rel_vs_row": rel / 2},
            {"backend": backend, "check": "state", "rel_state_vs_stock_f64": rel, "rel_state_vs_stock_fp32": rel},
        ]
    out.append({"backend": "torch", "check": "chaining", "control_no_pad_guard_rel_vs_row": control})
    return out


REFERENCE = ReferenceFigures("0" * 64, 1e-6, 2e-6, [1e-6, 2e-6])


def findings(tmp_path: Path, found_rows: list[dict], problems=()) -> PairFindings:
    graph = tmp_path / "pair_P8_S4.tflite"
    graph.write_bytes(b"\0" * 12)
    return PairFindings(graph, "R64", "fp32", CENSUS, {"kind": "pair"}, list(problems), found_rows, REFERENCE, P=8, S=4)


def test_a_passing_pair_keeps_the_records_keys_and_figures(tmp_path):
    result = pair_verification.result(findings(tmp_path, rows()), LIMITS, 10.0)
    summary = result.record["summary"]
    assert list(result.record) == ["summary", "census", "metadata", "reference_record", "no_decision", "rows"]
    assert list(summary) == [
        "P",
        "S",
        "form",
        "weights",
        "thresholds",
        "passed",
        "problems",
        "bytes",
        "max_rel_vs_row",
        "max_rel_per_position_vs_row",
        "max_rel_prefix_hidden_vs_row",
        "max_rel_state_vs_stock_f64",
        "max_rel_per_position_state_vs_stock_f64",
        "max_rel_state_vs_stock_fp32",
        "controls",
        "controls_required_over_threshold",
    ]
    assert result.passed and summary["passed"] and summary["bytes"] == 12
    assert summary["max_rel_prefix_hidden_vs_row"] == {"torch": 5e-7, "litert": 5e-7}
    assert list(summary["controls"]) == ["torch zero_state", "litert zero_state", "torch no_pad_guard"]
    assert result.figures["control_over_threshold"] == 1.0 / 1e-4
    assert result.name == "pair_P8_S4" and result.record_path == Path("results/pair_P8_S4.json")


def test_a_row_over_its_bound_or_a_weak_control_fails_after_the_files_problems(tmp_path):
    result = pair_verification.result(findings(tmp_path, rows(rel=2e-4), ["census: rank 5"]), LIMITS, 10.0)
    assert result.problems[0] == "census: rank 5" and not result.record["summary"]["passed"]
    assert any("rel_vs_row" in p for p in result.problems[1:])
    weak = pair_verification.result(findings(tmp_path, rows(control=5e-4)), LIMITS, 10.0)
    assert [p.split(":")[0] for p in weak.problems] == [
        "control zero_state (torch)",
        "control zero_state (litert)",
        "control no_pad_guard (torch)",
    ]


def test_the_worst_per_backend_is_a_record_that_reads_back_and_lets_no_nan_hide():
    nan = [{"backend": "litert", "check": "chaining", "rel_vs_row": float("nan")}]
    worst = pair_verification.per_backend(rows() + nan, "rel_vs_row")
    assert worst.to_json() == {"torch": 1e-6, "litert": worst.litert} and math.isnan(worst.worst())
    assert PerBackend.from_json({"torch": 1e-6, "litert": None}, "x").worst() == 1e-6
    with pytest.raises(ClefError, match="litert"):
        PerBackend.from_json({"torch": 1e-6}, "summary: max_rel_vs_row")
