"""The bundle stage's work once the graphs are merged (scripts/litert/bundle.py): the bundle verified
against the files it was made from (scripts/checks/bundle_check.py) into its record (BundleRecord).

Before merging, every graph must be there, of this revision, form, weights and shape, with its reference
record (preflight); the bundle's metadata records each graph's metadata, the names of its signatures in
the bundle and the fingerprint of the file it came from (size, sha256 of its head). Each graph's
reference record then runs through its signatures in the bundle and in its own file, on the CPU
accelerator and on the GPU accelerator alone in every mode verify_gpu runs (where verify_gpu runs whole
graphs: verify_gpu.layers resolving to `all`, and weights the GPU takes); every output must be
bit-identical. Memory: the bundle and the largest graph, each compiled with every signature run once, in
a process of its own. Problems: a census violation, a constant stored twice in the bundle's file (read
back and hashed), an output that differs, or a signature the GPU accelerator does not run whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.checks import bundle_check, compare
from scripts.litert import bundle, gpu_accelerator, tflite_file
from scripts.litert.cpu_graph import CpuGraph
from scripts.pipeline import layout, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record, optional
from scripts.release import references

GPU_MODES = gpu_accelerator.MODES

GraphMetadata = dict[str, dict]
"""A graph's name -> its metadata as the bundle records it: its own file's, its signatures' names and which
file it was (preflight)."""


def preflight(graphs: list[bundle_check.Graph], rec: SnapshotRecord, form: str, weights: str) -> GraphMetadata:
    """Every graph there, of this revision, form, weights and shape, with its reference record ->
    {name: metadata}."""
    metas = {}
    for g in graphs:
        layout.require(g.path)
        layout.require(layout.reference_path(g.path))
        want = {"revision": rec.revision, "form": form, "weights": weights, "kind": g.kind, **g.shape}
        meta = tflite_file.read_metadata(g.path)
        bad = tflite_file.metadata_mismatches(meta, want)
        if bad:
            raise ClefError(f"{g.path}: metadata {'; '.join(bad)}; rerun its export stage")
        # which file it was: the release refuses a bundle whose parts are not the graphs it has
        metas[g.name] = {**meta, "signatures": g.signatures, "file": bundle.fingerprint(g.path).to_json()}
    return metas


@dataclass(frozen=True)
class BundleMetadata(Record):
    """The bundle's own metadata (its METADATA_NAME entry): its kind, model, form and weights, and each
    graph's (preflight)."""

    kind: str
    revision: str
    repo: str
    source: str
    form: str
    weights: str
    graphs: GraphMetadata


def metadata(rec: SnapshotRecord, form: str, weights: str, metas: GraphMetadata) -> BundleMetadata:
    """The bundle's own metadata, as merge writes it (`to_json`)."""
    return BundleMetadata("bundle", rec.revision, rec.repo, rec.source, form, weights, metas)


def gpu_not_checked_why(depth: str, source: str) -> str | None:
    """Why the bundle is not run on the GPU accelerator, or None where it is: verify_gpu runs whole graphs
    (verify_gpu.layers resolving to `all` for model.source); it reads every pipeline `weights` itself."""
    if params.gpu_depth(depth, source) != "all":
        return (
            f"verify_gpu.layers resolves to block for model.source {source}: "
            "the GPU runs sections of the first block, not whole graphs"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class IdentityRow(Record):
    """One graph's reference record through the bundle against its own file on one accelerator
    (results/bundle.json `identity`): the bundle's error against the record's expectation
    (references.reference_error), then bundle_check.difference's figures; on the GPU, whether it ran
    whole and on which adapter."""

    graph: str
    accelerator: str
    fully_accelerated: bool | None = optional()
    adapter: str | None = optional()
    rel_vs_expected: float
    rel_per_position_vs_expected: float
    per_position_vs_expected: list[float]
    identical: bool
    max_rel: float
    outputs: int
    why: str | None = optional()


def identity_cpu(path: Path, graphs: list[bundle_check.Graph]) -> list[IdentityRow]:
    """Each graph's reference record through the bundle and through its own file on the CPU accelerator."""
    rows, whole = [], CpuGraph(path)
    try:
        for g in graphs:
            record = references.load_reference(layout.REFERENCES, layout.reference_path(g.path).name)
            own = CpuGraph(g.path)
            try:
                _, expected = bundle_check.run_record(references.interpreter_signature(own), g.kind, record)
            finally:
                own.close()
            figures, got = bundle_check.run_record(
                references.renamed(references.interpreter_signature(whole), g.signatures), g.kind, record
            )
            rows.append(
                IdentityRow(
                    graph=g.name, accelerator="cpu", **figures, **bundle_check.difference(got, expected).to_json()
                )
            )
            print(f"bundle: {g.name} on the CPU: identical {rows[-1].identical}", flush=True)
    finally:
        whole.close()
    return rows


def identity_gpu(path: Path, graphs: list[bundle_check.Graph], census: dict) -> list[IdentityRow]:
    """The same on the GPU accelerator alone, in each of its modes."""
    rows = []
    for mode in GPU_MODES:
        whole = gpu_accelerator.compile(path, mode, census)
        try:
            for g in graphs:
                record = references.load_reference(layout.REFERENCES, layout.reference_path(g.path).name)
                own = gpu_accelerator.compile(g.path, mode)
                try:
                    _, expected = bundle_check.run_record(own.signature, g.kind, record)
                finally:
                    own.close()
                figures, got = bundle_check.run_record(
                    references.renamed(whole.signature, g.signatures), g.kind, record
                )
                rows.append(
                    IdentityRow(
                        graph=g.name,
                        accelerator=f"gpu {mode}",
                        fully_accelerated=whole.fully_accelerated,
                        adapter=whole.adapter,
                        **figures,
                        **bundle_check.difference(got, expected).to_json(),
                    )
                )
                print(f"bundle: {g.name} on the GPU ({mode}): identical {rows[-1].identical}", flush=True)
        finally:
            whole.close()
    return rows


@dataclass(frozen=True)
class BundleRecord(Record):
    """results/bundle.json: the bundle, its sharing and size against the largest graph, every identity
    row, its memory against the largest graph per accelerator, its census, and the problems."""

    file: str
    form: str
    weights: str
    graphs: list[str]
    signatures: dict[str, int]
    sharing: dict
    largest_graph: dict
    bytes_over_graph: float
    bytes_goal_over_graph: float
    duplicate_constants: dict
    identity: list[IdentityRow]
    gpu_checked: bool
    gpu_not_checked_why: str | None
    memory: dict[str, bundle_check.MemoryAgainst]
    memory_goal_over_graph: float
    census: dict
    passed: bool
    problems: list[str]


def verify(
    path: Path, final: Path, graphs: list[bundle_check.Graph], merged, form: str, weights: str, goals: dict, why
) -> BundleRecord:
    """The bundle merged at `path` (to be moved to `final`) verified: `goals` is params.yaml `bundle`, `why`
    gpu_not_checked_why's answer (None: the GPU accelerator runs it too)."""
    census = tflite_file.census(path)
    found = tflite_file.violations(census)
    largest = max((g.path for g in graphs), key=lambda f: f.stat().st_size)
    rows = identity_cpu(path, graphs) + (identity_gpu(path, graphs, census) if why is None else [])
    problems = [f"census: {v}" for v in found]
    repeated = bundle.duplicate_constants(path)
    if repeated.buffers:
        problems.append(
            f"{repeated.buffers} constants stored more than once ({repeated.bytes} bytes): the weights are not shared"
        )
    problems += [
        f"{r.graph} on the {r.accelerator}: outputs differ from its own file's (max rel {compare.shown(r.max_rel)})"
        for r in rows
        if not r.identical
    ]
    problems += [
        f"{r.graph} on the {r.accelerator}: not every op on the GPU accelerator"
        for r in rows
        if r.fully_accelerated is False
    ]
    accelerators = ("cpu", "gpu") if why is None else ("cpu",)
    return BundleRecord(
        str(final),
        form,
        weights,
        [g.name for g in graphs],
        merged.signatures,
        merged.to_json(),
        {"file": str(largest), "bytes": largest.stat().st_size},
        merged.bytes / largest.stat().st_size,
        goals["bytes_goal_over_graph"],
        repeated,
        rows,
        why is None,
        why,
        {a: bundle_check.memory_against(path, largest, a) for a in accelerators},
        goals["memory_goal_over_graph"],
        {k: census[k] for k in ("op_total", "max_rank", "subgraphs", "dtypes")},
        not problems,
        problems,
    )


@dataclass(frozen=True)
class BundleMetrics(Record):
    """The bundle's metrics row (results/metrics/bundle.json; metrics.write drops a None)."""

    passed: bool
    max_rel: float | None
    threshold: float
    bytes: int
    op_total: int
    max_rank: int


def metrics_row(doc: BundleRecord) -> BundleMetrics:
    """The bundle's metrics row: its worst difference, held to 0."""
    return BundleMetrics(
        passed=doc.passed,
        max_rel=max((r.max_rel for r in doc.identity), default=None),
        threshold=0.0,
        bytes=doc.sharing["bytes"],
        op_total=doc.census["op_total"],
        max_rank=doc.census["max_rank"],
    )


def line(doc: BundleRecord) -> str:
    """The stage's result in a line."""
    sharing = doc.sharing
    return (
        f"bundle: {doc.file} ({sharing['bytes']} bytes, {doc.bytes_over_graph:.3f}x "
        f"{Path(doc.largest_graph['file']).name}; {len(doc.signatures)} signatures; constants "
        f"{sharing['constant_bytes']} of {sharing['part_constant_bytes']} bytes stored)"
    )
