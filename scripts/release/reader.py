"""Reading a release: its format, the manifest's checks (paths confined to the release, every file's
hash), the graphs' expected identity, and the bounds `clef verify` holds the reference records to.

The release's layout (artifacts/release/): manifest.json, README.md (the model card), the graphs (by
default bundle/<name>.tflite, every row and pair signature over one copy of the weights; with
release.layout `files`, rows/ and pairs/, a .tflite each), host/ (config, tokenizer, embed_tokens +
lm_head), checks/ (one reference record per graph, scripts/release/references.py: its inputs and torch's
output, held to the threshold the manifest promises), and, when signed, model.sig
(scripts/release/signing.py), the one file the manifest cannot list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from scripts.checkpoint.snapshot import sha256_file
from scripts.pipeline.errors import ClefError, first_of
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import checkpoint_layout
from scripts.release.manifest import ArtifactEntry, Artifacts, FileEntry, Manifest, Reference
from scripts.release.signing import SIGNATURE

if TYPE_CHECKING:
    from scripts.pipeline.mappings import Tensors

# 2: `signing`, and `max_over_recorded` in every reference entry; 3: `artifacts` keyed by graph name, each
# naming the `file` that holds it and its `signature_names` there (a bundle holds them all), `layout`, `bundle`
FORMAT = "clef-litert-release/4"


MANIFEST = "manifest.json"


CARD = "README.md"


HOST_TENSORS = {"embed_tokens": checkpoint_layout.EMBED_TOKENS, "lm_head": checkpoint_layout.LM_HEAD}


HOST_WEIGHTS = "host/model.safetensors"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_sha256(t) -> str:
    """Hash of a tensor's raw bytes (dtype-exact: a bf16 tensor hashes its bf16 bits)."""
    import torch  # here: reading a manifest (clef --version, clef verify's hashes) needs no torch

    return sha256_bytes(t.contiguous().view(torch.uint8).numpy().tobytes())


def host_tables(host) -> Tensors:
    """{role: tensor} of the host tables a release carries (roles as in HOST_TENSORS)."""
    return {"embed_tokens": host.embed_tokens, "lm_head": host.lm_head}


def reference_problems(figures: dict, reference: Reference) -> list[str]:
    """A reference record's figures against the bounds the manifest's `reference` entry states."""
    from scripts.checks import compare

    bounds = {
        "rel_vs_expected": reference.threshold,
        "rel_per_position_vs_expected": reference.threshold_per_position,
    }
    return compare.judge([figures], bounds)


# Below float32's machine epsilon an error is rounding noise, not a figure to hold 10x to.
FP32_EPS = 2.0**-23


def drift_problems(figures: dict, reference: Reference) -> list[str]:
    """A reference record's figures against the ones measured at release time: more than the manifest's
    `max_over_recorded` times the recorded figure (floored at float32's epsilon) means a different
    runtime or a changed graph, even under the threshold. NaN anywhere fails."""
    from scripts.checks import compare

    factor = reference.max_over_recorded
    out = []
    for key, recorded in (
        ("rel_vs_expected", reference.max_rel),
        ("rel_per_position_vs_expected", reference.max_rel_per_position),
    ):
        measured = figures.get(key)
        if compare.exceeds(recorded, float("inf")):
            out.append(f"{key}: the manifest's recorded figure {recorded!r} is not a finite number")
        elif compare.exceeds(measured, factor * max(recorded, FP32_EPS)):
            out.append(
                f"{key} {compare.shown(measured)} is more than {factor:g}x the {recorded:.3g} measured at release "
                "(a different runtime or a changed graph)"
            )
    return out


def graph_metadata(meta: dict | None, name: str) -> dict | None:
    """A graph's own metadata from the metadata of the file that holds it: the file's, or, in a bundle,
    the entry the bundle keeps for that graph (None where it has none)."""
    if meta is not None and meta.get("kind") == "bundle":
        return (meta.get("graphs") or {}).get(name)
    return meta


def bundle_problems(census: dict, file: str, artifacts: Artifacts) -> list[str]:
    """A file's signatures against the manifest's graphs it holds: one line per signature the manifest
    names and the file lacks, and per signature the file has that no graph of the manifest names."""
    named = {n for a in artifacts.values() if a.file == file for n in (a.signature_names or {}).values()}
    have = set(census["signatures"])
    return [f"{file}: no signature {n!r}, which the manifest names" for n in sorted(named - have)] + [
        f"{file}: signature {n!r} is not named by the manifest" for n in sorted(have - named)
    ]


def declared_weights(meta: dict | None) -> str:
    """The precision a file's metadata says its Linear weights are stored at (a graph made before
    params.yaml had `weights` says nothing, and stored float32)."""
    return (meta or {}).get("weights", "fp32")


def metadata_problems(meta: dict | None, manifest: Manifest, name: str) -> list[str]:
    """Where the metadata of the file holding graph `name` (tflite_file.read_metadata) disagrees with the
    manifest's entry for it: the one comparison clef verify, clef audit and clef run make."""
    from scripts.litert import tflite_file

    expected = expected_metadata(manifest, manifest.artifacts[name])
    return tflite_file.metadata_mismatches(graph_metadata(meta, name), expected.to_json())


@dataclasses.dataclass(frozen=True)
class GraphIdentity(Record):
    """What a graph must say of itself in its metadata (tflite_file.read_metadata): the checkpoint's
    revision, the form and weights, its kind and its shape (L for a row, P and S for a pair)."""

    revision: str
    form: str
    weights: str
    kind: str
    L: int | None = optional()
    P: int | None = optional()
    S: int | None = optional()


def expected_metadata(manifest: Manifest, artifact: ArtifactEntry) -> GraphIdentity:
    """What a release's graph must say of itself given its manifest entry."""
    return GraphIdentity(
        manifest.model.revision, manifest.form, manifest.weights, artifact.kind, artifact.L, artifact.P, artifact.S
    )


def json_kind(value) -> str:
    """A JSON value's kind in words, for a message ("a list", "a number", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before numbers: a bool is an int
        return "a boolean"
    kinds = ((dict, "an object"), (list, "a list"), (str, "a string"), ((int, float), "a number"))
    return next(word for types, word in kinds if isinstance(value, types))


# The manifest's tables every command indexes, each {name: JSON object}.
TABLES = ("artifacts", "files")


def load_manifest(root: Path) -> Manifest:
    """A release's manifest, refused (one line) unless it is a JSON object of this FORMAT whose TABLES
    are objects of objects, then holding every field of a Manifest (one line naming the file and the
    first it lacks): every command reads it here, so none meets a list where it indexes a table."""

    path = Path(root) / MANIFEST
    if not path.is_file():
        raise ClefError(f"{root} is not a release: no {MANIFEST}")
    try:
        manifest = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ClefError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise ClefError(f"{path} is not a JSON object ({json_kind(manifest)})")
    if manifest.get("format") != FORMAT:
        raise ClefError(f"{path}: format {manifest.get('format')!r}, this clef reads {FORMAT}")
    for table in TABLES:
        if table not in manifest:
            raise ClefError(f"{path} has no `{table}`")
        if not isinstance(manifest[table], dict):
            raise ClefError(f"{path}: `{table}` is not a JSON object ({json_kind(manifest[table])})")
        for name, entry in manifest[table].items():
            if not isinstance(entry, dict):
                raise ClefError(f"{path}: `{table}` entry {name!r} is not a JSON object ({json_kind(entry)})")
    return Manifest.from_json(manifest, str(path))


def outside(root: Path, name) -> str | None:
    """Why manifest path `name` does not name a file inside release `root` (None when it does): not a
    string, absolute, with a `..` part, or resolving (through a symlink) outside the directory."""
    if not isinstance(name, str) or not name:
        return "is not a relative path"
    pure = PurePosixPath(name)
    if pure.is_absolute() or Path(name).is_absolute():
        return "is absolute"
    if ".." in pure.parts:
        return "climbs out with '..'"
    top = Path(root).resolve()
    if not (top / name).resolve().is_relative_to(top):
        return "leaves the release through a symlink"
    return None


def check_paths(root: Path, manifest: Manifest) -> list[str]:
    """Every path the manifest names (`files`, each artifact's `file`, the reference records) must lie
    inside the release and be listed in `files` with its hash: one line per path that does not.
    Checked before anything is hashed or loaded, so no path can make clef read outside the release."""
    files = manifest.files
    problems = [f"manifest path {name!r} {why}" for name in files if (why := outside(root, name))]
    for art in manifest.artifacts.values():
        for what, path in (("graph", art.file), ("reference record", art.reference.file)):
            why = outside(root, path)
            if why:
                problems.append(f"manifest {what} path {path!r} {why}")
            elif path not in files:
                problems.append(f"manifest {what} path {path!r} is not listed in `files` (its hash is unknown)")
    return problems


def check_files(root: Path, manifest: Manifest) -> list[str]:
    """Problems with the files themselves, one line each: missing, changed (size or sha256), extra."""
    root = Path(root)
    listed = manifest.files
    unlisted = {Path(MANIFEST), Path(SIGNATURE)}
    present = {str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and f.relative_to(root) not in unlisted}
    problems = [f"missing file: {name}" for name in sorted(set(listed) - present)]
    for name in sorted(set(listed) & present):
        if why := changed(root, name, listed[name]):
            problems.append(f"changed file: {name} ({why})")
    problems += [f"extra file: {name} (not in the manifest)" for name in sorted(present - set(listed))]
    return problems


def changed(root: Path, name: str, entry: FileEntry) -> str | None:
    """How release file `name` differs from its `files` entry: its size (free to read), else its sha256
    (the whole file read); None when it is the file the manifest lists."""
    size = (Path(root) / name).stat().st_size
    if size != entry.size:
        return f"{size} bytes, the manifest lists {entry.size}"
    if sha256_file(Path(root) / name) != entry.sha256:
        return "sha256 differs from the manifest"
    return None


def graph_identity(root: Path, manifest: Manifest, name: str) -> list[str]:
    """What the file holding graph `name` says it is against the manifest's entry for it, one phrase per
    difference: its metadata (kind, L or P/S, revision, form, weights) and the names and input/output
    shapes of its signatures, all from the flatbuffer head (no weights read). A file that is another
    graph than the manifest names (a row of another L, a pair, another bundle) is named here before
    anything runs it."""
    from scripts.litert import litert_c, tflite_file

    art = manifest.artifacts[name]
    head = tflite_file.read_head(Path(root) / art.file)
    said = metadata_problems(tflite_file.read_metadata(head), manifest, name)
    problems = [f"its metadata: {', '.join(said)}"] if said else []
    shapes = litert_c.signature_shapes(head)
    for own, called in (art.signature_names or {}).items():
        if called not in shapes:
            problems.append(f"no signature {called!r}")
            continue
        want = (art.signatures or {}).get(own)
        off = [
            f"{e.name} {shapes[called][side].get(e.name)}, the manifest says {e.shape}"
            for side in ("inputs", "outputs")
            for e in (getattr(want, side) if want else [])
            if shapes[called][side].get(e.name) != e.shape
        ]
        if off:
            problems.append(f"signature {called!r}: {first_of(off)}")
    return problems
