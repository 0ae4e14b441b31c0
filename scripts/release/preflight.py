"""What the release stage refuses before it builds anything, one line each: an artifact that is
missing, whose metadata names another revision, form, weights or shape, whose checks did not pass or
that left no reference record or figures; a bundle whose graphs or signatures are not the params'
lengths and pairs, that did not pass its stage, or that was made from other files than the graphs
there now; and an overall check that did not pass. A refusal leaves the previous release in place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.litert import bundle, tflite_file
from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError
from scripts.release.plan import PlannedGraph
from scripts.release.reader import GraphIdentity

# The checks of the whole model (not of one graph) a release vouches for: the manifest's `verification`.
OVERALL = ("kernel", "layers", "model", "stack", "kernel_bench", "export_bench")


@dataclasses.dataclass(frozen=True)
class CheckedGraph:
    """A planned graph found sound, with what its file says of itself: its metadata
    (tflite_file.read_metadata) and census (tflite_file.census)."""

    graph: PlannedGraph
    metadata: dict
    census: dict


def read_metrics(name: str) -> dict:
    """One check's metrics row (results/metrics/<name>.json), as its stage wrote it."""
    return layout.read_record(layout.metrics_path(name))


def graphs(planned: list[PlannedGraph], rec: SnapshotRecord, form: str, weights: str) -> list[CheckedGraph]:
    """Everything the release will vouch for is there, verified, and of this revision, form and weights."""
    out = []
    for g in planned:
        path = layout.require(g.path)
        layout.require(layout.reference_path(path))
        layout.require(layout.reference_figures_path(path))
        want = GraphIdentity(rec.revision, form, weights, g.kind, **g.shape)
        meta = tflite_file.read_metadata(path)
        bad = tflite_file.metadata_mismatches(meta, want.to_json())
        if bad:
            raise ClefError(f"{g.path}: metadata {'; '.join(bad)}; rerun its export stage")
        for check in g.checks:
            if read_metrics(check).get("passed") is False:
                raise ClefError(f"{g.path}: check {check} did not pass; not releasing it")
        out.append(CheckedGraph(g, meta, tflite_file.census(path)))
    return out


def bundle_file(planned: list[PlannedGraph], rec: SnapshotRecord, form: str, weights: str) -> Path:
    """The bundle holds exactly the graphs params.yaml asks for, under the signature names layout gives
    them, made from the graph files there now, and passed its stage -> its path."""
    path = layout.require(layout.bundle_path(rec, form, weights), "bundle")
    meta = tflite_file.read_metadata(path) or {}
    want = {"kind": "bundle", "revision": rec.revision, "form": form, "weights": weights}
    bad = tflite_file.metadata_mismatches(meta, want)
    if bad:
        raise ClefError(f"{path}: metadata {'; '.join(bad)}; rerun the bundle stage")
    held = meta.get("graphs") or {}
    want = {g.name for g in planned}
    if set(held) != want:
        raise ClefError(
            f"{path} holds graphs {sorted(held)}, params.yaml asks for {sorted(want)}: rerun the bundle stage"
        )
    have = set(tflite_file.census(path)["signatures"])
    named = {n for g in planned for n in g.signatures.values()}
    if have != named:
        raise ClefError(
            f"{path}: signatures {sorted(have ^ named)} are missing or not asked for: rerun the bundle stage"
        )
    for g in planned:
        if bundle.fingerprint(g.path).to_json() != held[g.name].get("file"):
            raise ClefError(f"{g.path} is not the file the bundle {path.name} was made from: rerun the bundle stage")
    if read_metrics("bundle").get("passed") is not True:
        raise ClefError(f"{path}: the bundle stage's checks did not pass; not releasing it")
    return path


def overall() -> dict[str, dict]:
    """The whole model's checks (OVERALL) -> {name: metrics row}, refused unless none failed."""
    rows = {n: read_metrics(n) for n in OVERALL}
    if not all(rows[n].get("passed", True) for n in rows):
        raise ClefError(f"a check did not pass: {[n for n in rows if rows[n].get('passed') is False]}")
    return rows
