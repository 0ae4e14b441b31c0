"""scripts/pipeline/bounds.py: recorded figures held to the pass/fail bounds params.yaml sets now. The
records are written here, one of each kind (a fresh clone has none: they are DVC outputs); the session's
pipeline run holds its own through check_params (tests/test_dvc_pipeline.py BAD_BOUNDS)."""

import copy
import json
import math

import pytest
import yaml

from scripts.pipeline import atomic, bounds, layout
from tests.conftest import ROOT

COMMITTED = yaml.safe_load((ROOT / "params.yaml").read_text())
GIB = 2**30


@pytest.fixture()
def records(tmp_path):
    """One record of each kind, every figure well within the committed bounds."""
    written = {
        "results/metrics/layers.json": {
            "passed": True,
            "max_rel": 2e-6,
            "max_rel_per_position": 5e-6,
            "threshold": 1e-5,
            "control_over_threshold": 5e4,
        },
        "results/pair_P64_S64.json": {
            "summary": {
                "passed": True,
                "max_rel_vs_row": {"torch": 2e-6, "litert": 3e-6},
                "max_rel_state_vs_stock_f64": {"torch": 5e-6, "litert": 6e-6},
            }
        },
        "results/gpu/gpu_row_L64.json": {"passed": True, "modes": {"mixed": {"over_floor": 1.5}}},
        "results/runtime/stack.json": {
            "stage": "stack",
            "peak_anon_bytes": GIB // 2,
            "memory_budget": {"fp32_stack_bytes": 10**6, "within": True},
        },
        "results/stack.json": {"fp32_bytes": 10**6, "peak_rss_bytes": GIB // 2, "rss_budget": {"within": True}},
    }
    for path, rec in written.items():
        atomic.write_json(tmp_path / path, rec)
    return tmp_path


def edit_record(root, path, change) -> None:
    rec = json.loads((root / path).read_text())
    change(rec)
    (root / path).write_text(json.dumps(rec))


def with_value(key: str, value) -> dict:
    p = copy.deepcopy(COMMITTED)
    *sections, last = key.split(".")
    target = p
    for s in sections:
        target = target[s]
    target[last] = value
    return p


def test_records_within_the_committed_bounds_pass(records):
    assert bounds.problems(COMMITTED, records) == []


def test_a_figure_over_its_bound_is_named_with_its_key_and_record(records):
    edit_record(records, "results/metrics/layers.json", lambda r: r.update(max_rel=2.5e-5))
    (said,) = bounds.problems(COMMITTED, records)
    assert said.startswith("params.yaml verify_layers.max_rel_vs_stock_f64: a bound of 1e-05 fails max_rel 2.5e-05")
    assert "results/metrics/layers.json" in said and "(verify_layers)" in said


def test_a_tightened_bound_fails_the_largest_figure_of_a_record(records):
    (said,) = bounds.problems(with_value("verify_pair.max_rel_vs_row", 2.5e-6), records)
    assert "verify_pair.max_rel_vs_row: a bound of 2.5e-06 fails summary.max_rel_vs_row 3e-06" in said


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
    fault = 5e4 * 1e-5  # control_over_threshold x the threshold it was held to: the fault's error
    need = COMMITTED["controls"]["min_over_threshold"]
    (said,) = bounds.problems(with_value("verify_layers.max_rel_vs_stock_f64", fault / need * 1.01), records)
    assert said.startswith("params.yaml controls.min_over_threshold x verify_layers.max_rel_vs_stock_f64")
    assert bounds.problems(with_value("verify_layers.max_rel_vs_stock_f64", fault / need * 0.99), records) == []


def test_budgets_hold_the_recorded_peaks(records):
    p = with_value("memory", {"factor": 1.0, "overhead_gib": 0.4})
    (said,) = bounds.problems(p, records)
    assert "params.yaml memory: a bound of 0.401 GiB fails stage stack's peak anonymous memory 0.500 GiB" in said
    (said,) = bounds.problems(with_value("stack.rss_overhead_gib", 0.25), records)
    assert said.startswith("params.yaml stack: a bound of 0.251 GiB fails the peak RSS 0.500 GiB")


def test_a_half_mode_is_held_to_the_floor_only_when_named(records):
    assert bounds.problems(with_value("verify_gpu.fp16_max_over_floor", 1.2), records) == []  # held_to_floor: []
    p = with_value("verify_gpu.held_to_floor", ["mixed"])
    p["verify_gpu"]["fp16_max_over_floor"] = 1.2
    (said,) = bounds.problems(p, records)
    assert "the mixed mode's over_floor 1.5" in said and str(layout.GPU) in said


def test_a_recorded_decision_figure_is_held_only_where_its_place_is_enforced(records):
    """check_params holds every recorded decision figure of an enforced place to params.yaml's decision
    bounds (the mean KLD from above, the same-top share from below); a place not enforced is only recorded."""
    mixed = {"kld_mean": 4e-4, "same_top": 0.995}
    made = {"weights": "fp16", "places": {"gpu_mixed": mixed}}
    edit_record(records, "results/gpu/gpu_row_L64.json", lambda r: r.update(decision=made))
    assert bounds.problems(COMMITTED, records) == []  # gpu_mixed enforced, within 1e-3 and 99 %
    (said,) = bounds.problems(with_value("decision.max_kld_mean.gpu_mixed", 1e-4), records)
    assert said.startswith("params.yaml decision.max_kld_mean.gpu_mixed: a bound of 0.0001 fails the gpu_mixed")
    (said,) = bounds.problems(with_value("decision.min_same_top.gpu_mixed", 0.999), records)
    assert "decision.min_same_top.gpu_mixed: a bound of 0.999 fails the gpu_mixed same-top share 0.995" in said
    assert bounds.problems(with_value("decision.enforced", ["cpu"]), records) == []
    edit_record(
        records, "results/pair_P64_S64.json", lambda r: r.update(decision={"weights": "int8", "places": {"cpu": mixed}})
    )
    assert bounds.problems(COMMITTED, records) == []  # int8 weights: the storage's effect is recorded, not held
    edit_record(
        records, "results/pair_P64_S64.json", lambda r: r.update(decision={"weights": "fp32", "places": {"cpu": mixed}})
    )
    kld, same = bounds.problems(COMMITTED, records)  # the CPU is held to float32 rounding: both fail
    assert "decision.max_kld_mean.cpu" in kld and "results/pair_P64_S64.json" in kld
    assert "decision.min_same_top.cpu" in same
