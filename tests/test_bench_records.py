"""The benchmarks' records (scripts/bench/*) read back the results they wrote and write them out unchanged:
a field renamed, dropped or retyped in a record fails here against the committed results/*.json, where the
benchmarks themselves need a GPU accelerator or hours to run again."""

import dataclasses
import json
from pathlib import Path

import pytest

from scripts.bench import gpu_bench, gpu_mixed, gpu_parts, report, weights_bench
from scripts.pipeline.errors import ClefError

RESULTS = Path(__file__).resolve().parent.parent / "results"


def committed(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_gpu_mixed_reads_back_and_writes_out_its_results_unchanged():
    doc = committed("gpu_mixed.json")
    record = gpu_mixed.GpuMixed.from_json(doc, "gpu_mixed.json")
    assert isinstance(record.spread["padded"].rows[0], gpu_mixed.SpreadRow)
    assert isinstance(record.trace.largest_part.pieces[0], gpu_mixed.TracedPiece)
    assert record.to_json() == doc
    del doc["trace"]["parts"][0]["mixed_over_rounding"]
    with pytest.raises(ClefError, match=r"parts\[0\]: no `mixed_over_rounding`"):
        gpu_mixed.GpuMixed.from_json(doc, "gpu_mixed.json")


def test_gpu_bench_reads_back_and_writes_out_its_results_unchanged():
    doc = committed("gpu_bench.json")
    record = gpu_bench.GpuBench.from_json(doc, "gpu_bench.json")
    refused = [c for c in record.candidates if c.gpu_cpu is not None]
    assert refused and all(isinstance(m, gpu_bench.MixedCompile) for c in refused for m in c.gpu_cpu.values())
    assert all(isinstance(c.runs["fp16"], gpu_bench.Run | None) for c in record.candidates)
    assert gpu_bench.json_safe(record.to_json()) == doc


def test_weights_bench_reads_back_and_writes_out_its_results_unchanged():
    doc = committed("weights.json")
    record = weights_bench.WeightsBench.from_json(doc, "weights.json")
    assert record.variants["fp32"].vs_fp32_graph is None
    assert isinstance(record.variants["int8"].gpu["fp16"], weights_bench.GpuTake)
    assert record.to_json() == doc


def test_bench_reads_back_and_writes_out_its_results_unchanged():
    """results/bench.json (scripts/bench/report.py): both workspaces, the efficiency and clef-flash's needs;
    readme.py reads this file's keys, so they may not move."""
    doc = committed("bench.json")
    record = report.Bench.from_json(doc, "bench.json")
    assert isinstance(record.tiny.stages["bundle"], report.StageFigures)
    assert isinstance(record.real_width.gpu_worst["fp16"], report.WorstOverFloor)
    assert isinstance(record.tiny.weights.variants["fp16"], report.VariantFigures)
    assert isinstance(record.clef_flash.stages["bundle"], report.StageNeeds)
    assert isinstance(record.clef_flash.default_pipeline, report.DefaultPipeline)
    assert record.to_json() == doc


def test_clef_flash_is_extrapolated_as_bench_json_holds_it():
    """extrapolate and default_pipeline on bench.json's two workspaces give its clef_flash again."""
    doc = committed("bench.json")
    tiny, real = doc["tiny"], doc["real_width"]
    clef = report.extrapolate(tiny, real)
    run = report.default_pipeline(clef.to_json(), real["params"], tiny["params"])
    assert dataclasses.replace(clef, default_pipeline=run).to_json() == doc["clef_flash"]


def test_gpu_parts_reads_back_and_writes_out_its_results_unchanged():
    """A part's outputs sit beside `inputs` under the part's own names; one figure's key is no identifier."""
    doc = committed("gpu_parts.json")
    record = gpu_parts.GpuParts.from_json(doc, "gpu_parts.json")
    g = record.parts["g_softplus_before"].outputs["g"]
    assert isinstance(g.max_abs_err_where_small_g, gpu_parts.MaxError) and g.small_g_count is not None
    assert set(record.parts["gdn_layer_after"].outputs) == {"y", "conv", "z", "beta", "a"}
    assert isinstance(record.one_op["op_sum_2048_of_0.1"].outputs["y"].values, gpu_parts.FirstValues)
    assert isinstance(record.graphs.row.after, gpu_parts.GraphFigures)
    assert record.to_json() == doc


def test_gpu_parts_refuses_a_fix_figure_or_a_graph_scope_it_lacks():
    """The fix's exactness (under keys no identifier spells) and the whole graphs are records: a figure or a
    scope missing fails where it is read, named."""
    doc = committed("gpu_parts.json")
    record = gpu_parts.GpuParts.from_json(doc, "gpu_parts.json")
    assert isinstance(record.fix_exactness.softplus, gpu_parts.SoftplusExactness)
    assert isinstance(record.parts["gdn_layer_after"].mix_on_gpu_fp16_projections, gpu_parts.MixAttribution)
    del doc["fix_exactness"]["softplus_on_linspace_-80_80"]["series_fp32_vs_truth_max_rel"]
    with pytest.raises(ClefError, match=r"softplus_on_linspace_-80_80: no `series_fp32_vs_truth_max_rel`"):
        gpu_parts.GpuParts.from_json(doc, "gpu_parts.json")
    doc = committed("gpu_parts.json")
    del doc["graphs"]["one_layer"]
    with pytest.raises(ClefError, match=r"graphs: no `one_layer`"):
        gpu_parts.GpuParts.from_json(doc, "gpu_parts.json")


def test_gpu_mixed_errors_are_records_under_the_key_global():
    """A hidden state's errors stand under `global` and `worst_position`; one missing fails where it is read."""
    doc = committed("gpu_mixed.json")
    row = gpu_mixed.GpuMixed.from_json(doc, "gpu_mixed.json").spread["padded"].rows[1]
    assert isinstance(row.mixed, gpu_mixed.HiddenErrors)
    assert row.mixed.global_ == doc["spread"]["padded"]["rows"][1]["mixed"]["global"]
    del doc["spread"]["padded"]["rows"][1]["floor"]["global"]
    with pytest.raises(ClefError, match=r"rows\[1\]: floor: no `global` in"):
        gpu_mixed.GpuMixed.from_json(doc, "gpu_mixed.json")


def test_gpu_bench_refuses_a_floor_level_it_lacks():
    """The floor is a record of the two levels the candidates run at: one missing fails where it is read."""
    doc = committed("gpu_bench.json")
    assert isinstance(gpu_bench.GpuBench.from_json(doc, "gpu_bench.json").reference.floor.row, gpu_bench.Floor)
    del doc["reference"]["floor"]["layer"]
    with pytest.raises(ClefError, match=r"floor: no `layer`"):
        gpu_bench.GpuBench.from_json(doc, "gpu_bench.json")
