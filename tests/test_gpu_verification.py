"""verify_gpu's record (scripts/checks/gpu_verification.py): which graph it checks, the record's keys in
the order it has always had them, a partial acceleration the first problem, an int8 refusal recorded
and not failed, and a first block that misses an op kind refused in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.checks import gpu_check, gpu_verification
from scripts.checks.gpu_verification import GpuFindings, GraphShape
from scripts.litert.gpu_accelerator import GpuDevice
from scripts.pipeline.errors import ClefError

BOUNDS = gpu_check.GpuBounds(max_rel_fp32=1e-4, max_rel_per_position_fp32=1e-4, fp16_max_over_floor=2.0)
ROW_KEYS = ["graph", "form", "weights", "kind", "L", "passed", "problems", "device", "fully_accelerated"]


def rows() -> list[dict]:
    out = []
    for mode in gpu_check.MODES:
        r = {"mode": mode, "record": "padded", "finite": True, "rel_vs_torch": 1e-6, "rel_per_position_vs_torch": 1e-6}
        if mode in gpu_check.HALF_MODES:
            r.update(rel_vs_f64=0.02, rel_per_position_vs_f64=0.02, rel_floor_vs_f64=0.01)
            r.update(rel_per_position_floor_vs_f64=0.01, over_floor=2.0, over_floor_per_position=2.0)
        out.append(r)
    return out


def findings(accelerated: bool = True) -> GpuFindings:
    proof = SimpleNamespace(to_json=lambda: {"probe_error": 0.0})
    device = GpuDevice("soft", "", None, True)
    runs = {
        mode: SimpleNamespace(fully_accelerated=accelerated, proof=proof, seconds=1.23456, device=device)
        for mode in gpu_check.MODES
    }
    graph = SimpleNamespace(plans={}, max_bytes=1000)
    of = GraphShape(64, None, None)
    return GpuFindings(
        of, Path("artifacts/rows/row_L64.tflite"), "R64", "fp32", {"signatures": {}}, 8, 8, graph, runs, rows()
    )


def test_the_graph_checked_is_a_row_or_a_pair():
    row, pair = GraphShape(64, None, None), GraphShape(None, 256, 64)
    assert (row.kind, row.shape, row.name, row.tokens) == ("row", {"L": 64}, "gpu_row_L64", 64)
    assert (pair.kind, pair.shape, pair.name, pair.tokens) == ("pair", {"P": 256, "S": 64}, "gpu_pair_P256_S64", 256)


def test_a_fully_accelerated_graph_keeps_the_records_keys_and_passes():
    result = gpu_verification.result(findings(), BOUNDS)
    assert list(result.record)[: len(ROW_KEYS)] == ROW_KEYS and list(result.record)[-1] == "rows"
    assert result.passed and result.record["accelerator_seconds"] == {m: 1.235 for m in gpu_check.MODES}
    assert result.record["modes"]["fp16"]["fully_accelerated"] is True
    assert result.figures["L"] == 64 and result.record_path == Path("results/gpu/gpu_row_L64.json")
    assert result.lines[0].startswith("verify_gpu row_L64.tflite on soft, layers 8 of 8: fully accelerated True")


def test_a_partial_acceleration_is_the_first_problem():
    result = gpu_verification.result(findings(accelerated=False), BOUNDS)
    assert result.problems[0] == "is_fully_accelerated() is false" and not result.record["passed"]


def test_a_first_block_missing_an_op_kind_is_refused():
    graph = SimpleNamespace(
        plans={"prefix": SimpleNamespace(unreached=[]), "suffix": SimpleNamespace(unreached=["GATHER"])}
    )
    with pytest.raises(ClefError, match="p.tflite suffix: op kinds only after the first block"):
        gpu_verification.require_first_block_reaches_all(graph, Path("p.tflite"))
    graph.plans["suffix"].unreached = []
    gpu_verification.require_first_block_reaches_all(graph, Path("p.tflite"))


def test_a_mode_whose_decisions_miss_an_enforced_bound_fails_and_its_figures_are_recorded():
    """The decision record rides in the GPU record; a mode listed in decision.enforced that misses its bound is
    a problem naming the place, one that is not listed is only recorded."""
    import dataclasses

    from tests.test_tflite_verification import decision_record

    cpu_shaped = decision_record(5e-3, [])
    f = cpu_shaped.places["cpu"]
    made = dataclasses.replace(
        cpu_shaped,
        places={"gpu_mixed": f, "gpu_fp16": f, "torch_float16": cpu_shaped.places["torch_float16"]},
        bounds={"gpu_mixed": cpu_shaped.bounds["cpu"], "gpu_fp16": cpu_shaped.bounds["cpu"]},
        enforced=["gpu_mixed"],
    )
    result = gpu_verification.result(dataclasses.replace(findings(), decision=made), BOUNDS)
    assert not result.passed and result.problems == ["decision gpu_mixed L=8: mean KLD 0.005 over 16 tokens > 1e-06"]
    assert result.record["decision"]["places"]["gpu_fp16"]["kld_mean"] == 5e-3
    assert "gpu_mixed mean KLD 5.00e-03" in result.lines[0]
    assert gpu_verification.result(findings(), BOUNDS).record["decision"] is None
