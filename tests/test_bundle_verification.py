"""The bundle stage's record (scripts/checks/bundle_verification.py): why the GPU is not run on it,
the record's keys in the order it has always had them, its metrics row held to 0 and its line."""

from __future__ import annotations

from scripts.checks import bundle_check, bundle_verification
from scripts.checks.bundle_verification import BundleRecord, IdentityRow

KEYS = [
    "file",
    "form",
    "weights",
    "graphs",
    "signatures",
    "sharing",
    "largest_graph",
    "bytes_over_graph",
    "bytes_goal_over_graph",
    "duplicate_constants",
    "identity",
    "gpu_checked",
    "gpu_not_checked_why",
    "memory",
    "memory_goal_over_graph",
    "census",
    "passed",
    "problems",
]


def test_the_gpu_runs_the_bundle_only_where_verify_gpu_runs_whole_graphs_it_takes():
    assert bundle_verification.gpu_not_checked_why("all", "tiny") is None
    assert bundle_verification.gpu_not_checked_why("block", "tiny").startswith("verify_gpu.layers resolves")


def identity(accelerator: str, max_rel: float, **gpu) -> IdentityRow:
    figures = {"rel_vs_expected": 1e-6, "rel_per_position_vs_expected": 2e-6, "per_position_vs_expected": [2e-6]}
    return IdentityRow(
        graph="row_L8", accelerator=accelerator, **gpu, **figures, identical=not max_rel, max_rel=max_rel, outputs=1
    )


def test_an_identity_row_holds_the_gpu_figures_and_the_why_only_where_they_exist():
    """results/bundle.json `identity`: a CPU row without the GPU's keys, a GPU row with them, in the order
    the rows have always had, and read back as written."""
    cpu = identity("cpu", 0.0).to_json()
    assert list(cpu) == [
        "graph",
        "accelerator",
        "rel_vs_expected",
        "rel_per_position_vs_expected",
        "per_position_vs_expected",
        "identical",
        "max_rel",
        "outputs",
    ]
    gpu = identity("gpu fp16", 0.0, fully_accelerated=False, adapter="soft").to_json()
    assert list(gpu)[:4] == ["graph", "accelerator", "fully_accelerated", "adapter"]
    differ = IdentityRow.from_json(
        {**cpu, "identical": False, "max_rel": float("inf"), "why": "different outputs"}, "x"
    )
    assert differ.to_json()["why"] == "different outputs"
    assert IdentityRow.from_json(gpu, "identity[0]") == identity(
        "gpu fp16", 0.0, fully_accelerated=False, adapter="soft"
    )


def test_the_record_keeps_its_keys_its_metrics_row_and_its_line():
    sharing = {"bytes": 300, "constant_bytes": 100, "part_constant_bytes": 250}
    doc = BundleRecord(
        "artifacts/bundle/m.tflite",
        "R64",
        "fp16",
        ["row_L8"],
        {"row_L8": 0, "prefix_P8_S4": 1},
        sharing,
        {"file": "artifacts/rows/row_L8.tflite", "bytes": 200},
        1.5,
        1.1,
        {"buffers": 0, "bytes": 0},
        [identity("cpu", 0.0), identity("gpu fp16", 1e-3, fully_accelerated=True, adapter="soft")],
        False,
        "why",
        {},
        1.2,
        {"op_total": 7, "max_rank": 4},
        True,
        [],
    )
    assert list(doc.to_json()) == KEYS
    assert bundle_verification.metrics_row(doc).to_json() == dict(
        passed=True, max_rel=1e-3, threshold=0.0, bytes=300, op_total=7, max_rank=4
    )
    assert bundle_verification.line(doc) == (
        "bundle: artifacts/bundle/m.tflite (300 bytes, 1.500x row_L8.tflite; 2 signatures; "
        "constants 100 of 250 bytes stored)"
    )


def test_the_memory_figures_are_written_as_before():
    bundle, graph = bundle_check.HeldBytes(30, 40, 50), bundle_check.HeldBytes(10, 20, 25)
    against = bundle_check.MemoryAgainst(bundle, graph, 2.0, 2.0)
    assert against.to_json() == {
        "bundle": {"compiled": 30, "held": 40, "peak": 50},
        "largest_graph": {"compiled": 10, "held": 20, "peak": 25},
        "held_over_graph": 2.0,
        "peak_over_graph": 2.0,
    }
    assert list(against.to_json()["bundle"]) == ["compiled", "held", "peak"]


def test_the_bundles_metadata_keeps_its_keys_in_order():
    """The METADATA_NAME entry the bundle is written with: the keys, in the order, the dict had."""
    from scripts.checkpoint.snapshot import SnapshotRecord

    rec = SnapshotRecord("tiny", "org/model", "abc123", "artifacts/snapshot", {})
    graphs = {"row_L8": {"kind": "row", "L": 8, "signatures": {"row": "row_L8"}}}
    meta = bundle_verification.metadata(rec, "R64", "fp16", graphs).to_json()
    assert meta == {
        "kind": "bundle",
        "revision": "abc123",
        "repo": "org/model",
        "source": "tiny",
        "form": "R64",
        "weights": "fp16",
        "graphs": graphs,
    }
    assert list(meta) == ["kind", "revision", "repo", "source", "form", "weights", "graphs"]


def test_the_outputs_difference_says_why_only_when_they_cannot_be_compared():
    import torch

    a = {"row.hidden": torch.ones(2, 3)}
    same = bundle_check.difference(a, {"row.hidden": torch.ones(2, 3)})
    assert same.to_json() == {"identical": True, "max_rel": 0.0, "outputs": 1}
    moved = bundle_check.difference({"row.hidden": torch.full((2, 3), 1.5)}, a)
    assert not moved.identical and moved.max_rel == 0.5
    other = bundle_check.difference({"row.other": torch.ones(2, 3)}, a).to_json()
    assert other == {"identical": False, "max_rel": float("inf"), "outputs": 1, "why": "different outputs"}
