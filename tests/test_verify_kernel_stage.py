"""The verify_kernel stage: what it records, and the refusals (bad form, a crossed threshold)."""

from __future__ import annotations

import json

import yaml

from scripts.checks import kernel_check
from tests.conftest import assert_one_line_error, run_stage


def set_params(workdir, **changes):
    p = yaml.safe_load((workdir / "params.yaml").read_text())
    for key, value in changes.items():
        section, _, name = key.partition(".")
        if name:
            p[section][name] = value
        else:
            p[section] = value
    (workdir / "params.yaml").write_text(yaml.safe_dump(p))


def test_records_every_form_and_regime(workdir):
    set_params(workdir, **{"verify_kernel.forms": ["loop", "R64+ec+dd"]})
    proc = run_stage("verify_kernel", workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((workdir / "results" / "kernel.json").read_text())
    assert kernel_check.KernelRecord.from_json(doc, "kernel.json").to_json() == doc  # the record is the whole file
    summary = doc["summary"]
    assert summary["passed"] and summary["all_finite"] and summary["head_pairs_identical"]
    assert set(summary["max_rel_vs_f64"]) == {"loop", "R64+ec+dd", "R64+sp+ec+dd+vs6"}
    assert summary["max_rel_vs_stock"]["loop"]["out"] < 1e-6  # loop is the stock algorithm
    assert {(r["regime"], r["L"], r["initial_state"]) for r in doc["rows"]} == {
        (g, n, i)
        for g in ("strong_decay", "weak_decay", "correlated_keys", "one_key", "gate_extremes")
        for n in (256, 130, 200)
        for i in (False, True)
    }
    assert summary["fp16"]["R64+sp+ec+dd+vs6"]["all_finite"]
    # the vs6 contract's control: an unscaled state is visibly wrong
    assert summary["vs_control_unscaled_state_min_out_rel_vs_f64"] > 1e-2
    # the memory-cut control: the state dropped at chunk boundaries breaks the bound by >= 100x
    assert summary["control_memory_cut"]["over_threshold"] >= 100
    assert (
        summary["max_rel_vs_f64"]["R64+sp+ec+dd+vs6"]["out_per_position"]
        <= summary["thresholds"]["rel_per_position_vs_f64"]
    )


def test_threshold_crossed_names_the_row(workdir):
    set_params(workdir, **{"verify_kernel.forms": [], "verify_kernel.max_rel_vs_f64": 1e-9})
    line = assert_one_line_error(
        run_stage("verify_kernel", workdir),
        "verify_kernel failed",
        "check=R64+sp+ec+dd+vs6, L=256, regime=strong_decay",
        "> 1e-09",
    )
    assert "more)" in line


def test_form_not_finite_in_fp16_fails(workdir):
    """Without sp and ec the gate overflows fp16 (regime gate_extremes): the stage fails, naming the regime."""
    set_params(workdir, form="R64+dd+vs6", **{"verify_kernel.forms": []})
    assert_one_line_error(
        run_stage("verify_kernel", workdir),
        "verify_kernel failed",
        "R64+dd+vs6",
        "regime=gate_extremes",
        "not finite in fp16",
    )


def test_bad_form_refused_before_work(workdir):
    set_params(workdir, form="R48+ec")
    assert_one_line_error(run_stage("verify_kernel", workdir), "chunk 48 is not a power of two")
    assert not (workdir / "results" / "kernel.json").exists()
