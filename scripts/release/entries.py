"""A graph's entry in the release manifest: the file that holds it (its own, or the bundle), its
reference record with the figures its verify stage measured running that record through the graph
(scripts/release/references.py; the record's sha256 ties the two, so the release runs no graph), held
to the bounds that stage held the graph to, its checks' metrics and what verify_gpu measured of it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from scripts.checkpoint import snapshot
from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError
from scripts.release import builder, reader, references
from scripts.release.manifest import ArtifactEntry, GpuFigures, GpuRefused, Reference, StageOutput
from scripts.release.preflight import CheckedGraph, read_metrics

if TYPE_CHECKING:
    from scripts.pipeline.mappings import FileDigests


@dataclasses.dataclass(frozen=True)
class HeldFile:
    """The release file holding a graph: its release path, digests and size, the dvc.lock stage and
    md5 that produced it, and the graph's signature names in it."""

    file: str
    sha256: str
    md5: str
    bytes: int
    dvc_lock: StageOutput
    signature_names: dict[str, str]


GraphFiles = dict[str, HeldFile]
"""Graph name -> the release file holding it."""


def place_graphs(
    graphs: list[CheckedGraph], build: Path, lock: builder.LockedStages, mode: str, merged: Path | None
) -> GraphFiles:
    """The graph files into the release (release.layout `bundle`: the one bundle `merged`; `files`:
    each graph's own), each hashed once -> {graph name: the file holding it}."""
    if mode == "bundle":
        rel = f"bundle/{merged.name}"
        builder.place(merged, build / rel)
        dvc_lock = StageOutput("bundle", lock["bundle"].outs.get(str(layout.BUNDLE)) if "bundle" in lock else None)
        size = (build / rel).stat().st_size
        digests = builder.graph_digests(build / rel)
        held = HeldFile(rel, digests.sha256, digests.md5, size, dvc_lock, signature_names={})
        return {c.graph.name: dataclasses.replace(held, signature_names=c.graph.signatures) for c in graphs}
    holders = {}
    for c in graphs:
        path = c.graph.path
        rel = f"{c.graph.kind}s/{path.name}"
        builder.place(path, build / rel)
        stage = next((n for n, st in lock.items() if str(path) in st.outs), None)
        digests = builder.graph_digests(build / rel)
        holders[c.graph.name] = HeldFile(
            rel,
            digests.sha256,
            digests.md5,
            bytes=(build / rel).stat().st_size,
            dvc_lock=StageOutput(stage, lock[stage].outs[str(path)] if stage else None),
            signature_names={k: k for k in c.census["signatures"]},
        )
    return holders


def gpu_section(name: str) -> GpuFigures | GpuRefused:
    """What verify_gpu recorded for GPU check `name`."""
    path = layout.gpu_result_path(name)
    doc = layout.read_record(path)
    if "refused" in doc:  # int8 weights (stages/verify_gpu.py refused)
        return GpuRefused(False, doc["refused"])
    return GpuFigures.from_json(doc, str(path))


def reference(c: CheckedGraph, held: HeldFile, build: Path, max_over_recorded: float) -> tuple[Reference, str]:
    """The graph's reference record into the release, refused unless it is the record its verify stage
    measured and within the graph's bounds -> its entry, and its sha256."""
    path = c.graph.path
    check_file = f"checks/{path.stem}.safetensors"
    record_path = layout.reference_path(path)
    builder.place(record_path, build / check_file)
    figures_path = layout.reference_figures_path(path)
    measured = references.ReferenceFigures.read(figures_path)
    if snapshot.sha256_file(build / check_file) != measured.record_sha256:
        stage = layout.producer_of(record_path)
        raise ClefError(f"{record_path} is not the record {stage} measured ({figures_path}); rerun {stage}")
    entry = Reference(
        check_file,
        measured.rel_vs_expected,
        c.graph.bounds.overall,
        measured.rel_per_position_vs_expected,
        c.graph.bounds.per_position,
        max_over_recorded,
        measured.per_position_vs_expected,
    )
    found = reader.reference_problems(measured.to_json(), entry)
    if found:
        raise ClefError(f"{held.file}: reference record: {found[0]}")
    return entry, measured.record_sha256


def artifact_entry(
    c: CheckedGraph, held: HeldFile, build: Path, form: str, max_over_recorded: float
) -> tuple[ArtifactEntry, FileDigests]:
    """One graph into the release, `held` the file that holds it (place_graphs) -> its manifest entry,
    and {path: sha256} of the files placed (hashed here, not again for the file table)."""
    ref, record_sha256 = reference(c, held, build, max_over_recorded)
    contract = c.metadata["contract"]
    entry = ArtifactEntry(
        kind=c.graph.kind,
        **c.graph.shape,
        form=form,
        weights=c.metadata["weights"],
        file=held.file,
        signature_names=held.signature_names,
        sha256=held.sha256,
        bytes=held.bytes,
        md5=held.md5,
        dvc_lock=held.dvc_lock,
        signatures=builder.signatures(c.census, contract),
        census={k: c.census[k] for k in ("op_total", "max_rank", "ops_per_gdn_layer", "dtypes")},
        metadata={k: v for k, v in c.metadata.items() if k != "contract"},
        contract={k: v for k, v in contract.items() if k not in ("inputs", "outputs", "signatures")},
        verification={check: read_metrics(check) for check in c.graph.checks},
        gpu=gpu_section(c.graph.gpu),
        reference=ref,
    )
    return entry, {held.file: held.sha256, ref.file: record_sha256}
