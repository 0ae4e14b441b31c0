"""The release's manifest.json as typed records: what scripts/release/assemble.py writes and
scripts/release/reader.py reads back (clef verify, run, audit), one schema for both. Imports no torch,
so a device's clef reads a manifest without it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from scripts.pipeline.mappings import ForeignJson
from scripts.pipeline.provenance import GitState
from scripts.pipeline.records import Record, optional
from scripts.release.signing import Signed, Unsigned

if TYPE_CHECKING:
    from scripts.checkpoint.snapshot import SnapshotRecord

CARRIED = "carried"


def carried():
    """A field of the manifest's `bundle` entry carried over as it is from the bundle stage's
    results/bundle.json (BUNDLE_FIGURES)."""
    return dataclasses.field(metadata={CARRIED: True})


@dataclasses.dataclass(frozen=True)
class BundleSection(Record):
    """The manifest's `bundle` entry: the bundle the release ships, what the bundle stage measured of
    it (BUNDLE_FIGURES), whether each accelerator ran every signature as the graph's own file does, and
    whether its GPU was checked."""

    file: str
    bytes: int
    sha256: str
    signatures: dict = carried()
    sharing: dict = carried()
    largest_graph: dict = carried()
    bytes_over_graph: int = carried()
    duplicate_constants: dict = carried()
    memory: dict = carried()
    census: dict = carried()
    identity_vs_own_file: dict
    gpu_checked: bool
    gpu_not_checked_why: str | None


# What the manifest's `bundle` entry carries over from the bundle stage's results/bundle.json.
BUNDLE_FIGURES = tuple(f.name for f in dataclasses.fields(BundleSection) if f.metadata.get(CARRIED))


@dataclasses.dataclass(frozen=True)
class ModelSection(Record):
    """The manifest's `model` entry: the checkpoint (its repository, revision and source) and each of
    its snapshot files' sha256 and size, from the snapshot record."""

    repo: str
    revision: str
    source: str
    snapshot_files: dict[str, dict]

    @classmethod
    def of(cls, rec: SnapshotRecord) -> ModelSection:
        files = sorted(rec.files, key=lambda e: e.name)
        return cls(rec.repo, rec.revision, rec.source, {e.name: {"sha256": e.sha256, "size": e.size} for e in files})


@dataclasses.dataclass(frozen=True)
class HostTensor(Record):
    """One host table the release describes: its checkpoint key, dtype, shape, sha256 of its raw bytes
    (reader.tensor_sha256) and the checkpoint file holding it."""

    key: str
    dtype: str
    shape: list[int]
    sha256: str
    source_file: str


@dataclasses.dataclass(frozen=True)
class HostSection(Record):
    """The manifest's `host` entry: release.host_weights, the host tables by role (reader.HOST_TENSORS),
    and the release file holding them (None unless the mode is `include`)."""

    weights: str
    tensors: dict[str, HostTensor]
    weights_file: str | None
    precision: str | None = optional()  # release.host_weights_precision of the included tables (None: bf16)


@dataclasses.dataclass(frozen=True)
class SignatureTensor(Record):
    """One input or output of a signature as the file has it (tflite_file.census: name, shape, dtype),
    with the contract's meaning (None where the contract gives none)."""

    name: str
    shape: list[int]
    dtype: str
    meaning: str | None


@dataclasses.dataclass(frozen=True)
class SignatureTensors(Record):
    """A signature's inputs and outputs (each by name), the manifest's `signatures` entry for it."""

    inputs: list[SignatureTensor]
    outputs: list[SignatureTensor]


@dataclasses.dataclass(frozen=True)
class LockedStage(Record):
    """A stage's dvc.lock entry as the manifest's `stages` records it: its command, the md5 of each
    dependency and output by path (None where dvc.lock has none), and its params as dvc.lock holds them."""

    cmd: str | None
    deps: dict[str, str | None]
    outs: dict[str, str | None]
    params: ForeignJson


LockedStages = dict[str, LockedStage]
"""Stage name -> its dvc.lock entry."""


@dataclasses.dataclass(frozen=True)
class FileEntry(Record):
    """A release file's `files` entry in the manifest: its sha256 and size in bytes."""

    sha256: str
    size: int


FileTable = dict[str, FileEntry]
"""A release file's path (relative to the release) -> its entry."""


@dataclasses.dataclass(frozen=True)
class StageOutput(Record):
    """The manifest's `dvc_lock` entry of a graph: the dvc.lock stage that made its file and the md5 it
    records for it (None where dvc.lock has none)."""

    stage: str | None
    md5: str | None


@dataclasses.dataclass(frozen=True)
class GpuFigures(Record):
    """What verify_gpu measured of one graph on LiteRT's GPU accelerator (results/gpu/<check>.json),
    and the device that ran it: the manifest's `gpu` entry."""

    fully_accelerated: bool
    layers_checked: int
    layers: int
    fp32_max_rel_vs_torch: float
    threshold_fp32: float
    fp32_max_rel_per_position_vs_torch: float
    threshold_per_position_fp32: float
    fp16_max_rel_vs_f64: float
    fp16_max_rel_per_position_vs_f64: float
    floor_max_rel_vs_f64: float
    floor_max_rel_per_position_vs_f64: float
    fp16_over_floor: float
    fp16_target_over_floor: float
    fp16_within_target: bool
    all_finite: bool
    modes: dict
    positions: list
    device: dict
    decision: dict | None = optional()  # scripts/checks/decision_check.py's DecisionRecord, graphs run whole


@dataclasses.dataclass(frozen=True)
class GpuRefused(Record):
    """The manifest's `gpu` entry for a graph verify_gpu refused to run (int8 weights), and why."""

    fully_accelerated: bool
    refused: str


@dataclasses.dataclass(frozen=True)
class Reference(Record):
    """The manifest's `reference` entry: the record's release path, the figures measured running it and
    the bounds they are held to (here and by `clef verify`), how far `clef verify` may drift from them,
    and the figure at each position (the card's pictures)."""

    file: str
    max_rel: float
    threshold: float
    max_rel_per_position: float
    threshold_per_position: float
    max_over_recorded: float
    positions: list[float]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArtifactEntry(Record):
    """A graph's entry in the manifest's `artifacts` (scripts/release/entries.py): its kind and shape (L
    for a row, P and S for a pair), the file holding it and its signature names there, that file's
    digests, its signatures, census, metadata and contract, and what its checks, verify_gpu and its
    reference record measured."""

    kind: str
    L: int | None = optional()
    P: int | None = optional()
    S: int | None = optional()
    form: str
    weights: str
    file: str
    signature_names: dict[str, str]
    sha256: str
    bytes: int
    md5: str
    dvc_lock: StageOutput
    signatures: dict[str, SignatureTensors]
    census: dict
    metadata: dict
    contract: dict
    verification: dict[str, dict]
    gpu: GpuFigures | GpuRefused
    reference: Reference


Artifacts = dict[str, ArtifactEntry]
"""Graph name -> its manifest entry."""


@dataclasses.dataclass(frozen=True)
class Manifest(Record):
    """The release's manifest.json (scripts/release/reader.py load_manifest reads it back)."""

    format: str
    name: str
    layout: str
    bundle: BundleSection | None
    model: ModelSection
    form: str
    weights: str
    params: dict
    versions: dict
    git: GitState
    host: HostSection
    artifacts: Artifacts
    verification: dict[str, dict]
    stages: LockedStages
    files: FileTable
    signing: Signed | Unsigned
