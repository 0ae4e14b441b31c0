"""scripts/checks/finish.py: every verify stage ends the same way: record, metrics row, result line, then
the refusal when the check found a problem, the figures left behind for whoever reads why."""

from __future__ import annotations

import json

import pytest

from scripts.checks.finish import CheckResult, finish
from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError


def result(tmp_path, problems=()) -> CheckResult:
    return CheckResult(
        stage="verify_tflite L=64",
        name="tflite_L64",
        record={"rows": [{"rel_vs_torch": 2e-6}]},
        record_path=tmp_path / "results" / "tflite_L64.json",
        figures={"max_rel": 2e-6, "threshold": 1e-4, "L": 64},
        lines=["verify_tflite L=64: max rel vs torch 2.00e-06"],
        problems=list(problems),
    )


def test_a_passing_check_writes_its_record_and_row_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    finish(result(tmp_path))
    assert json.loads((tmp_path / "results/tflite_L64.json").read_text())["rows"][0]["rel_vs_torch"] == 2e-6
    row = json.loads((tmp_path / layout.metrics_path("tflite_L64")).read_text())
    assert row == {"passed": True, "max_rel": 2e-6, "threshold": 1e-4, "L": 64}
    assert capsys.readouterr().out == "verify_tflite L=64: max rel vs torch 2.00e-06\n"


def test_a_failing_check_leaves_its_figures_then_fails_naming_the_first_problem(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = ["record=full: rel_vs_torch 0.2 > 0.0001", "record=padded: an output is not finite"]
    with pytest.raises(
        ClefError, match=r"^verify_tflite L=64 failed: record=full: rel_vs_torch 0.2 > 0.0001 \(and 1 more\)$"
    ):
        finish(result(tmp_path, bad))
    assert json.loads((tmp_path / layout.metrics_path("tflite_L64")).read_text())["passed"] is False
    assert (tmp_path / "results/tflite_L64.json").is_file() and "max rel" in capsys.readouterr().out
