"""The checkpoint snapshot in Hugging Face cache layout, and the record that pins its bytes.

`hf/hub/models--<org>--<name>/snapshots/<40-hex revision>/` holds the snapshot whichever source
wrote it, so downstream code reads the embedded tiny checkpoint exactly as it reads the real one.
Writing a snapshot is `scripts/checkpoint/fetch.py`'s job; this module only knows where it lives and
what it must contain. The record (`results/snapshot.json`) lists every file with its size and sha256;
a stage that reads the snapshot checks the files it reads against it first (sizes, then hashes), so a
truncated or altered shard is refused before any weight is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.pipeline.errors import ClefError
from scripts.pipeline.mappings import ForeignJson
from scripts.pipeline.records import Record

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
CHUNK = 1 << 24
TOKENIZER_JSON = ("tokenizer_config.json", "tokenizer.json")  # what the host reads to encode a prompt


def snapshot_dir(cache: Path, repo: str, revision: str) -> Path:
    """Where the Hugging Face cache keeps `repo` at `revision` under cache root `cache` (hf/)."""
    return Path(cache) / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / revision


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in chunks (snapshot shards and graphs are many GB)."""
    return file_digests(path, (algorithm,))[algorithm]


def file_digests(path: Path, algorithms: tuple[str, ...]) -> dict[str, str]:
    """{algorithm: hex digest} of a file, every algorithm from one read; with more than one, each
    chunk is hashed by them side by side (hashlib releases the GIL on large updates), so a release
    graph costs one read and its slowest hash, not the sum."""
    hashes = [hashlib.new(a) for a in algorithms]
    with contextlib.ExitStack() as stack:
        pool = (
            stack.enter_context(ThreadPoolExecutor(len(hashes), thread_name_prefix="digest"))
            if len(hashes) > 1
            else None
        )
        f = stack.enter_context(open(path, "rb"))
        while block := f.read(CHUNK):
            if pool is None:
                hashes[0].update(block)
            else:
                list(pool.map(lambda h, b=block: h.update(b), hashes))
    return {a: h.hexdigest() for a, h in zip(algorithms, hashes, strict=True)}


def sha256_file(path: Path) -> str:
    from scripts.pipeline import profile

    with profile.part("hashing"):
        return file_digest(path, "sha256")


def refuse_pickles(names) -> None:
    pickles = sorted(n for n in names if n.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise ClefError(
            f"pickle checkpoint file {pickles[0]} refused: only safetensors weights are loaded "
            "(a pickle can run code when read)"
        )


@dataclasses.dataclass(frozen=True)
class SnapshotFile(Record):
    name: str  # relative to the snapshot directory
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class SnapshotRecord(Record):
    """results/snapshot.json: which checkpoint every stage reads, and the bytes of each of its files."""

    source: str  # params.yaml model.source
    repo: str
    revision: str
    path: str  # the snapshot directory, relative to the repository
    files: list[SnapshotFile]


def record(snapshot: Path, source: str, repo: str, revision: str, root: Path = Path(".")) -> SnapshotRecord:
    """The file record of a finished snapshot: every file with its size and sha256."""
    snapshot = Path(snapshot)
    names = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    files = [SnapshotFile(n, (snapshot / n).stat().st_size, sha256_file(snapshot / n)) for n in names]
    return SnapshotRecord(source, repo, revision, os.path.relpath(snapshot, root), files)


def read_json(path: str | Path) -> ForeignJson:
    """A JSON file of a snapshot (config.json, tokenizer_config.json, the safetensors index), or one
    line naming the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise ClefError(f"{path} is missing")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ClefError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ClefError(f"{path} holds a {type(doc).__name__}, not a JSON object")
    return doc


def text_config(snapshot: str | Path) -> ForeignJson:
    """config.json's `text_config` of a snapshot (or a release's host/ directory), or one line."""
    path = Path(snapshot) / "config.json"
    text = read_json(path).get("text_config")
    if not isinstance(text, dict):
        raise ClefError(f"{path} has no text_config object: not a Qwen3.5 checkpoint")
    return text


def max_positions(snapshot: str | Path) -> int:
    """The model's context (config.json's text_config.max_position_embeddings): no graph is longer."""
    n = text_config(snapshot).get("max_position_embeddings")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ClefError(
            f"{Path(snapshot) / 'config.json'}: text_config.max_position_embeddings {n!r} is not a positive integer"
        )
    return n


def check_readable(snapshot: str | Path) -> None:
    """The JSON files our code reads parse, and config.json has the context the checks need: a
    snapshot that fails is refused by the fetch stage, before any later stage removes an output."""
    max_positions(snapshot)
    check_tokenizer(snapshot)


def check_tokenizer(snapshot: str | Path) -> None:
    """The tokenizer's JSON files are there and parse (transformers would raise a traceback, or fall back to
    another tokenizer): the host encodes prompts with it, and the checks' records are text it tokenized."""
    for name in TOKENIZER_JSON:
        if not (Path(snapshot) / name).is_file():
            raise ClefError(f"{Path(snapshot) / name} is missing: the snapshot's tokenizer is needed to encode text")
        read_json(Path(snapshot) / name)


def load_record(path: str | Path = "results/snapshot.json") -> SnapshotRecord:
    path = Path(path)
    if not path.is_file():
        raise ClefError(f"no snapshot record at {path}: run the fetch stage first")
    return SnapshotRecord.from_json(json.loads(path.read_text()), str(path))


def verify(rec: SnapshotRecord, root: Path = Path("."), names=None) -> Path:
    """Check files of the recorded snapshot (all, or `names`) against the record; return its path.

    Sizes first for every file (cheap, catches truncation), then sha256. Pickles are refused.
    """
    snapshot = Path(root) / rec.path
    listed = {f.name: f for f in rec.files}
    refuse_pickles(listed)
    wanted = sorted(listed) if names is None else sorted(names)
    for name in wanted:
        if name not in listed:
            raise ClefError(f"{name} is not in the snapshot record of {rec.repo}@{rec.revision}")
        path = snapshot / name
        if not path.is_file():
            raise ClefError(f"snapshot file {name} is missing from {snapshot}")
        size = path.stat().st_size
        if size != listed[name].size:
            raise ClefError(f"snapshot file {name} has {size} bytes, the record says {listed[name].size}")
    for name in wanted:
        digest = sha256_file(snapshot / name)
        if digest != listed[name].sha256:
            raise ClefError(
                f"snapshot file {name} is corrupt: sha256 {digest[:12]}... differs from the "
                f"recorded {listed[name].sha256[:12]}..."
            )
    return snapshot
