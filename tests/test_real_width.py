"""make real-width's pieces that can be checked without a real-width run: the params override is
valid for every stage, and the clef-flash extrapolation scales what grows with the layer count."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from scripts.bench import real_width, report
from scripts.pipeline import layout, params
from tests.conftest import ROOT


def test_override_is_valid_params_for_every_section(tmp_path):
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = real_width.overridden(base)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    checked = params.load(list(p), path=tmp_path / "params.yaml")
    assert checked["model"]["source"] == "synthetic" and checked["lengths"] == [64, 256]
    assert checked["pairs"] == [{"prefix": 64, "suffix": 64}, {"prefix": 256, "suffix": 64}]
    # everything else is the committed params: the same form and thresholds as the tiny run
    assert {k: v for k, v in checked.items() if k not in ("model", "lengths", "pairs")} == {
        k: v for k, v in base.items() if k not in ("model", "lengths", "pairs")
    }
    assert {k: v for k, v in checked["model"].items() if k != "source"} == {
        k: v for k, v in base["model"].items() if k != "source"
    }


def test_extrapolation_scales_what_grows_with_the_weights():
    def ws(layers, stages, graph_bytes):
        return {
            "layers": layers,
            "fp32_bytes": layers * 1e9,
            "stages": stages,
            "latency": {"64": {"bytes": graph_bytes}},
        }

    tiny = ws(
        8,
        {"export@64": {"seconds": 10.0, "peak_rss_gib": 1.0}, "verify_kernel": {"seconds": 60.0, "peak_rss_gib": 0.5}},
        7e6,
    )
    real = ws(
        4,
        {"export@64": {"seconds": 30.0, "peak_rss_gib": 4.5}, "verify_kernel": {"seconds": 55.0, "peak_rss_gib": 0.5}},
        3.5e9,
    )
    tiny["stages"]["export@64"]["peak_anon_gib"], real["stages"]["export@64"]["peak_anon_gib"] = 0.5, 2.0
    tiny["stages"]["verify_model"] = {"seconds": 5.0, "peak_anon_gib": 0.5}
    real["stages"]["verify_model"] = {"seconds": 50.0, "peak_anon_gib": 6.0}  # the stack + a float64 layer
    # a stage's start-up (its imports) is the same at any depth: only the rest grows 8x
    tiny["stages"]["export@256"] = {"seconds": 12.0}
    real["stages"]["export@256"] = {"seconds": 40.0, "startup_seconds": 6.0}
    out = report.extrapolate(tiny, real)
    assert out.stages["export@256"].seconds == 6.0 + 8 * 34.0
    # more than one stack copy above the runtime: only one copy's worth grows with the depth
    assert out.stages["verify_model"].peak_anon_gib == 6.0 + 7 * (4e9 / 2**30)
    assert out.blocks == 8
    stack = 4e9 / 2**30  # the real-width run's fp32 stack, GiB
    assert out.stages["export@64"].to_json() == {
        "seconds": 8 * 30.0,
        # above the runtime: weights up to one stack copy grow 8x, the rest (per-layer work) does not
        "peak_rss_gib": 4.5 + 7 * min(3.5, stack),
        "peak_anon_gib": 2.0 + 7 * 1.5,
        "peak_rss_gib_upper": 1.0 + 8 * 3.5,
        "peak_anon_gib_upper": 0.5 + 8 * 1.5,
    }
    assert out.stages["verify_kernel"].to_json() == {"seconds": 55.0, "peak_rss_gib": 0.5}  # set by widths
    assert out.row_graph_bytes_per_L == 8 * 3.5e9 and out.fp32_stack_bytes == 8 * 4e9
    assert out.without_tiny_run == []
    # a real-width stage the tiny run lacks is named, not silently dropped from the total
    real["stages"]["release"] = {"seconds": 90.0}
    out = report.extrapolate(tiny, real)
    assert out.without_tiny_run == ["release"] and "release" not in out.stages


def test_the_release_is_extrapolated_with_clef_flashs_host_tables_not_the_synthetic_ones():
    """The synthetic checkpoint keeps the tiny tokenizer's 320 tokens: its host file is a few MB where
    clef-flash's bf16 tables are 4 GB. The release's figure takes them at clef-flash's vocabulary."""
    real = {
        "layers": 4,
        "fp32_bytes": 4e9,
        "stages": {},
        "latency": {},
        "bundle": {"bytes": 1_000},
        "release_bytes": 1_000 + 5_000 + 300,  # the bundle, the host file, the rest
        "host_tables": {"file_bytes": 5_000, "shapes": {"embed_tokens": [320, 4096], "lm_head": [320, 4096]}},
        "weights": {"bundle_bytes": {"fp16": 1_000, "int4_dynamic": 300}},
    }
    out = report.extrapolate({"stages": {}}, real)
    host = 2 * report.CLEF_FLASH_VOCAB * 4096 * 2
    assert out.release_bytes == 8 * 1_000 + 300 + host
    assert out.release_bytes_by_weights == {"fp16": 8 * 1_000 + 300 + host, "int4_dynamic": 8 * 300 + 300 + host}
    assert out.release_bytes_by_weights_and_host["int4_dynamic"]["bf16"] == out.release_bytes_by_weights["int4_dynamic"]
    assert out.release_bytes_by_weights_and_host["int4_dynamic"]["int4b32"] < 8 * 300 + 300 + 0.3 * host


@pytest.mark.parametrize("layers", ["block", "all"])
def test_a_gpu_stage_that_runs_the_first_block_costs_at_clef_flash_what_it_cost_at_real_width(layers):
    """verify_gpu.layers: block loads, references and runs the first block at any depth: its time is as
    measured; all: it grows with the layers. Its memory is scaled either way (sections grow with the stack)."""
    stage = {"seconds": 100.0, "accelerator_seconds": 80.0, "peak_anon_gib": 5.0}
    tiny = {"layers": 8, "fp32_bytes": 8e6, "stages": {"verify_gpu_row@64": {"seconds": 5.0, "peak_anon_gib": 0.5}}}
    real = {
        "layers": 4,
        "fp32_bytes": 4e9,
        "stages": {"verify_gpu_row@64": stage},
        "latency": {},
        "params": {"verify_gpu": {"layers": layers}},
    }
    out = report.extrapolate(tiny, real).stages["verify_gpu_row@64"]
    times = 1 if layers == "block" else 8
    assert (out.seconds, out.accelerator_seconds) == (times * 100.0, times * 80.0)
    assert out.peak_anon_gib == 5.0 + 7 * min(4.5, 4e9 / 2**30)


def test_default_pipeline_interpolates_the_sizes_the_run_did_not_have():
    """The real-width run has L 64 and 256 and pairs 64+64 and 256+64; the default pipeline's L=128 and
    pair 128+64 are interpolated, verify_model scales with the sum of the lengths, release with the
    number of graphs, the first-block benchmark is as measured; the peak is held to the budget."""

    def f(seconds, anon):
        return {"seconds": seconds, "peak_anon_gib": anon}

    clef = {
        "stages": {
            "export@64": f(100.0, 30.0),
            "export@256": f(300.0, 34.0),
            "verify_pair@64_64": f(200.0, 31.0),
            "verify_pair@256_64": f(520.0, 33.0),
            "verify_model": f(320.0, 35.0),
            "release": f(40.0, 1.0),
            "export_bench": f(50.0, 5.0),
            "verify_gpu_row@64": {**f(600.0, 20.0), "accelerator_seconds": 400.0},
            "verify_gpu_row@256": {**f(1800.0, 21.0), "accelerator_seconds": 1500.0},
        },
        "memory_budget_gib": 34.5,
    }
    measured = {"lengths": [64, 256], "pairs": [{"prefix": 64, "suffix": 64}, {"prefix": 256, "suffix": 64}]}
    default = {
        "lengths": [64, 128, 256],
        "pairs": [{"prefix": 256, "suffix": 64}, {"prefix": 128, "suffix": 64}, {"prefix": 64, "suffix": 64}],
    }
    out = report.default_pipeline(clef, measured, default)
    s = out.stages
    assert s["export@128"] == {"seconds": 100.0 + 200.0 * 64 / 192, "peak_anon_gib": 30.0 + 4.0 * 64 / 192}
    assert s["verify_pair@128_64"]["seconds"] == 200.0 + 320.0 * 64 / 192
    assert s["verify_model"]["seconds"] == 320.0 * 448 / 320
    assert s["release"]["seconds"] == 40.0 * 6 / 4
    assert s["export_bench"]["seconds"] == 50.0
    assert out.seconds == sum(v["seconds"] for v in s.values())
    assert out.gpu_hours * 3600 == pytest.approx(600.0 + 1000.0 + 1800.0)  # @128 interpolated
    assert out.accelerator_hours * 3600 == pytest.approx(400.0 + (400.0 + 1100.0 / 3) + 1500.0)
    del clef["stages"]["verify_gpu_row@64"]["accelerator_seconds"]  # an old record: not known, not a guess
    assert report.default_pipeline(clef, measured, default).accelerator_hours is None
    clef["stages"]["verify_gpu_row@64"]["accelerator_seconds"] = 400.0
    assert out.peak_anon_stage == "verify_model" and out.peak_anon_gib == 35.0
    assert out.within_budget is False  # 35 > 34.5: the check can fail
    assert report.default_pipeline({**clef, "memory_budget_gib": 36.0}, measured, default).within_budget is True
    # bench.json's clef_flash.default_pipeline: the keys readme.py reads, and the record read back
    assert list(out.to_json())[:4] == ["lengths", "pairs", "stages", "seconds"]
    assert report.DefaultPipeline.from_json(out.to_json(), "bench.json") == out


def test_interpolation_extends_beyond_the_measured_sizes():
    assert report.interpolated({64: 1.0, 256: 4.0}, 320) == 5.0
    assert report.interpolated({64: 1.0}, 256) == 1.0


def test_runtime_records_are_named_as_the_pipeline_names_the_stage(tmp_path):
    """verify_gpu's module runs two stages: its records join verify_gpu_row@L and verify_gpu_pair@P_S."""
    runtime = tmp_path / "results" / "runtime"
    runtime.mkdir(parents=True)
    for name in ("verify_gpu@64", "verify_gpu@256_64", "export@64", "stack"):
        (runtime / f"{name}.json").write_text(
            json.dumps(
                {
                    "stage": name,
                    "argv": [],
                    "seconds": 1.0,
                    "peak_rss_bytes": 1,
                    "peak_anon_bytes": 1,
                    "finished_utc": "x",
                }
            )
        )
    records = report.stage_records(tmp_path)
    assert sorted(records) == ["export@64", "stack", "verify_gpu_pair@256_64", "verify_gpu_row@64"]
    # the accelerator's share comes from verify_gpu's own record, both modes summed, where it was kept
    assert "accelerator_seconds" not in records["verify_gpu_row@64"].to_json()
    gpu = tmp_path / layout.gpu_result_path(layout.gpu_name(prefix=256, suffix=64))
    gpu.parent.mkdir(parents=True)
    gpu.write_text('{"accelerator_seconds": {"fp32": 0.25, "fp16": 0.5}}')
    assert report.stage_records(tmp_path)["verify_gpu_pair@256_64"].accelerator_seconds == 0.75


def test_gpu_figures_come_from_each_record_per_mode_and_the_worst_lets_nan_through(tmp_path):
    """bench.json's real_width.gpu and gpu_worst: a record with `modes` gives every mode's figures; one
    made before verify_gpu ran mixed gives fp32 and fp16 from its flat keys and no mixed. The worst
    ratio to the floor over the graphs: NaN is never hidden by a larger figure."""
    from scripts.checks import gpu_check
    from scripts.pipeline import atomic

    assert report.GPU_HALF_MODES == gpu_check.HALF_MODES

    def half(max_rel, floor, over, per, within):
        return {
            "max_rel_vs_f64": max_rel,
            "max_rel_per_position_vs_f64": 2 * max_rel,
            "floor_max_rel_vs_f64": floor,
            "floor_max_rel_per_position_vs_f64": 2 * floor,
            "over_floor": over,
            "over_floor_per_position": per,
            "target_over_floor": 2.0,
            "within_target": within,
            "enforced": False,
            "fully_accelerated": True,
            "probe": {"max_rel": 1e-3},
        }

    fp32 = {"max_rel_vs_torch": 1e-6, "max_rel_per_position_vs_torch": 1e-5, "fully_accelerated": True, "rows": 2}
    atomic.write_json(
        tmp_path / layout.gpu_result_path(layout.gpu_name(64)),
        {
            "L": 64,
            "layers_checked": 4,
            "layers": 4,
            "fp16_over_floor": 9.5,  # the flat keys are not read where `modes` is
            "modes": {
                "fp32": fp32,
                "fp16": half(0.03, 0.003, 10.0, float("nan"), False),
                "mixed": half(0.004, 0.003, 1.3, 1.7, True),
            },
        },
    )
    atomic.write_json(
        tmp_path / layout.gpu_result_path(layout.gpu_name(prefix=64, suffix=64)),
        {
            "P": 64,
            "S": 64,
            "layers_checked": 4,
            "layers": 4,
            "fully_accelerated": False,
            "fp32_max_rel_vs_torch": 2e-6,
            "fp32_max_rel_per_position_vs_torch": 3e-6,
            "fp16_max_rel_vs_f64": 0.05,
            "fp16_max_rel_per_position_vs_f64": 0.06,
            "floor_max_rel_vs_f64": 0.004,
            "fp16_over_floor": 12.5,
            "fp16_within_target": False,
        },
    )
    out = report.gpu_figures(tmp_path)
    gpu = out.gpu
    assert sorted(gpu) == ["gpu_pair_P64_S64", "gpu_row_L64"]
    row = gpu["gpu_row_L64"]
    assert (row.layers_checked, row.layers) == (4, 4)
    assert row.fp32.to_json() == {
        "fully_accelerated": True,
        "max_rel_vs_torch": 1e-6,
        "max_rel_per_position_vs_torch": 1e-5,
    }
    assert row.mixed.to_json() == {
        "fully_accelerated": True,
        "max_rel_vs_f64": 0.004,
        "max_rel_per_position_vs_f64": 0.008,
        "floor_max_rel_vs_f64": 0.003,
        "over_floor": 1.3,
        "over_floor_per_position": 1.7,
        "within_target": True,
    }
    assert row.fp16.over_floor == 10.0 and row.fp16.within_target is False
    old = gpu["gpu_pair_P64_S64"]
    assert sorted(old.to_json()) == ["fp16", "fp32", "layers", "layers_checked"]  # no mixed before it ran
    assert old.fp32.to_json() == {
        "fully_accelerated": False,
        "max_rel_vs_torch": 2e-6,
        "max_rel_per_position_vs_torch": 3e-6,
    }
    assert old.fp16.to_json() == {
        "fully_accelerated": False,
        "max_rel_vs_f64": 0.05,
        "max_rel_per_position_vs_f64": 0.06,
        "floor_max_rel_vs_f64": 0.004,
        "over_floor": 12.5,
        "over_floor_per_position": None,
        "within_target": False,
    }
    worst = out.gpu_worst
    assert worst["fp16"].over_floor == 12.5  # the old record's, the larger
    assert math.isnan(worst["fp16"].over_floor_per_position)  # NaN wins over every figure
    assert worst["mixed"].to_json() == {"over_floor": 1.3, "over_floor_per_position": 1.7}  # the one that ran mixed
    # a workspace whose verify_gpu has not run: no graphs, no worst
    assert report.gpu_figures(tmp_path / "none").to_json() == {
        "gpu": {},
        "gpu_worst": {m: {"over_floor": None, "over_floor_per_position": None} for m in ("fp16", "mixed")},
    }
