"""scripts/pipeline/bounds.py: recorded figures held to the pass/fail bounds params.yaml sets now."""

import copy
import json
import math
import shutil

import pytest
import yaml

from scripts.pipeline import bounds, layout
from tests.conftest import ROOT

COMMITTED = yaml.safe_load((ROOT / "params.yaml").read_text())


@pytest.fixture()
def records(tmp_path):
    """A copy of the committed records (results/), to edit; dvc.yaml beside it names their stages."""
    shutil.copytree(ROOT / layout.RESULTS, tmp_path / layout.RESULTS)
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return tmp_path


def edit_record(root, path, change) -> None:
    rec = json.loads((root / path).read_text())
    change(rec)
    (root / path).write_text(json.dumps(rec))


def test_the_committed_records_meet_the_committed_bounds():
    assert bounds.problems(COMMITTED, ROOT) == []


def test_a_figure_over_its_bound_is_named_with_its_key_and_record(records):
    edit_record(records, "results/metrics/layers.json", lambda r: r.update(max_rel=2.5e-5))
    (said,) = bounds.problems(COMMITTED, records)
    assert said.startswith("params.yaml verify_layers.max_rel_vs_stock_f64: a bound of 1e-05 fails max_rel 2.5e-05")
    assert "results/metrics/layers.json" in said and "(verify_layers)" in said


def test_nan_never_meets_a_bound(records):
    edit_record(
        records,
        "results/pair_P64_S64.json",
        lambda r: r["summary"]["max_rel_state_vs_stock_f64"].update(torch=math.nan),
    )
    (said,) = bounds.problems(COMMITTED, records)
    assert "verify_pair.max_rel_state_vs_stock_f64" in said and "nan" in said


def test_a_record_of_a_failed_run_is_not_held(records):
    """A run that failed is not in dvc.lock and its stage reruns anyway: its record blocks nothing."""
    edit_record(records, "results/metrics/layers.json", lambda r: r.update(max_rel=1.0, passed=False))
    assert bounds.problems(COMMITTED, records) == []


def test_a_control_must_still_break_a_looser_bound(records):
    p = copy.deepcopy(COMMITTED)
    control = json.loads((records / "results/metrics/model.json").read_text())
    fault = control["control_over_threshold"] * control["threshold"]
    p["verify_model"]["max_rel_vs_stock_f64"] = fault / p["controls"]["min_over_threshold"] * 1.01
    found = [s for s in bounds.problems(p, records) if "control" in s]
    assert len(found) == 1 and found[0].startswith("params.yaml controls.min_over_threshold x verify_model.")
    p["verify_model"]["max_rel_vs_stock_f64"] = fault / p["controls"]["min_over_threshold"] * 0.99
    assert not [s for s in bounds.problems(p, records) if "control" in s]


def test_budgets_hold_the_recorded_peaks(records):
    peak = json.loads((records / layout.runtime_path("stack")).read_text())["peak_anon_bytes"]
    p = copy.deepcopy(COMMITTED)
    p["memory"] = {"factor": 0.0, "overhead_gib": 0.99 * peak / 2**30}
    found = bounds.problems(p, records)
    assert any("stage stack's peak anonymous memory" in s for s in found), found
    p["stack"]["rss_overhead_gib"] = 0.01
    assert any(s.startswith("params.yaml stack: a bound of") for s in bounds.problems(p, records))


def test_a_half_mode_held_to_the_floor_meets_its_records():
    p = copy.deepcopy(COMMITTED)
    p["verify_gpu"]["held_to_floor"] = ["mixed"]
    worst = max(json.loads(f.read_text())["modes"]["mixed"]["over_floor"] for f in (ROOT / layout.GPU).glob("*.json"))
    p["verify_gpu"]["fp16_max_over_floor"] = worst * 0.99
    assert any("the mixed mode's over_floor" in s for s in bounds.problems(p, ROOT))
    p["verify_gpu"]["fp16_max_over_floor"] = worst * 1.5
    assert not [s for s in bounds.problems(p, ROOT) if "over_floor" in s]
