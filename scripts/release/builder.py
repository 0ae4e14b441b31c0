"""Building a release (the release stage): the host files, the reference records, the signatures table,
the dvc.lock provenance, and the tarball. What a reader checks is scripts/release/reader.py's.

Everything under `files` is a pure function of the checkpoint, the code and params.yaml, so a rebuild
gives the same hashes; the run-specific figures (times, dvc.lock hashes of the benchmark results) live
only in manifest.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tarfile
from pathlib import Path

from scripts.checkpoint.snapshot import file_digests, sha256_file
from scripts.pipeline import atomic, params
from scripts.pipeline.mappings import FileDigests
from scripts.release.manifest import (
    FileEntry,
    FileTable,
    HostSection,
    HostTensor,
    LockedStage,
    LockedStages,
    SignatureTensor,
    SignatureTensors,
)
from scripts.release.reader import HOST_TENSORS, HOST_WEIGHTS, MANIFEST, host_tables, tensor_sha256

WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")


def check_host_weights(mode) -> str:
    return params.one_of(*params.HOST_WEIGHT_MODES)(mode, "release.host_weights")


def place(src: Path, dest: Path) -> None:
    """dest as a hard link to src where the filesystem allows (a 30 GB graph is not copied), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def host_files(snap: Path, host, dest: Path, mode: str, precision: str = "bf16") -> HostSection:
    """Copy the snapshot's non-weight files (config, tokenizer) to dest/host and, under mode
    `include`, embed_tokens and lm_head at `precision` (release.host_weights_precision: bf16 as the
    checkpoint holds them, or int8 / int4 codes with their scales, scripts/qwen35/host_tables.py) as
    safetensors; -> the manifest's `host` section (the tables' hashes are the checkpoint's bf16 ones)."""
    from safetensors.torch import save_file

    from scripts.qwen35 import host_tables as host_tables_at

    check_host_weights(mode)
    precision = host_tables_at.check(precision)
    (dest / "host").mkdir(parents=True, exist_ok=True)
    for f in sorted(snap.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(f, dest / "host" / f.name)
    index = json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"]
    tables = host_tables(host)
    tensors = {
        role: HostTensor(
            key,
            str(tables[role].dtype).replace("torch.", ""),
            list(tables[role].shape),
            tensor_sha256(tables[role]),
            index[key],
        )
        for role, key in HOST_TENSORS.items()
    }
    if mode == "include":
        stored = {
            key + suffix: t
            for role, key in HOST_TENSORS.items()
            for suffix, t in host_tables_at.encode(tables[role], precision).items()
        }
        save_file(stored, str(dest / HOST_WEIGHTS), metadata={"format": "pt", "host_weights_precision": precision})
    held = precision if mode == "include" and precision != host_tables_at.BF16 else None  # None: bf16
    return HostSection(mode, tensors, HOST_WEIGHTS if mode == "include" else None, held)


def signatures(census: dict, contract: dict) -> dict[str, SignatureTensors]:
    """{signature name: its inputs and outputs as the file has them (name, shape, dtype), with the
    contract's meaning beside each}; the file is the authority on shapes, the contract on meaning."""
    declared = contract.get("signatures") or {
        "serving_default": {"inputs": contract["inputs"], "outputs": contract["outputs"]}
    }
    out = {}
    for sig, io_ in census["signatures"].items():
        meanings = {
            e["name"]: e["meaning"] for side in ("inputs", "outputs") for e in declared.get(sig, {}).get(side, [])
        }
        out[sig] = SignatureTensors(
            *(
                [
                    SignatureTensor(**e, meaning=meanings.get(e["name"]))
                    for e in sorted(io_[side], key=lambda e: e["name"])
                ]
                for side in ("inputs", "outputs")
            )
        )
    return out


def lock_stages(
    path: Path = Path("dvc.lock"), stage: str = "release", pipeline: Path = Path("dvc.yaml")
) -> LockedStages:
    """The dvc.lock entries of the stages `stage` depends on, transitively, as {stage: {cmd, deps, outs,
    params}} with md5 per path: what produced its inputs, and nothing downstream or beside it (a stage
    that reran after it, `latency` say, would otherwise be recorded at hashes it never saw). Read, not
    declared as a dependency: DVC rewrites it after each stage, so under `dvc repro` it holds every
    upstream stage's hashes by the time `stage` runs."""
    import yaml

    if not path.is_file():
        return {}
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})

    def hashes(entries):
        return {e["path"]: e.get("md5") for e in entries or []}

    def covers(out: str, dep: str) -> bool:
        return dep == out or dep.startswith(out.rstrip("/") + "/") or out.startswith(dep.rstrip("/") + "/")

    declared = yaml.safe_load(pipeline.read_text())["stages"][stage].get("deps", [])
    wanted, upstream = set(declared), set()
    while True:
        found = {
            name
            for name, st in stages.items()
            if name != stage
            and name not in upstream
            and any(covers(o, d) for o in hashes(st.get("outs")) for d in wanted)
        }
        if not found:
            break
        upstream |= found
        wanted |= {d for name in found for d in hashes(stages[name].get("deps"))}
    return {
        name: LockedStage(st.get("cmd"), hashes(st.get("deps")), hashes(st.get("outs")), st.get("params", {}))
        for name, st in sorted(stages.items())
        if name in upstream
    }


def file_table(root: Path, known: FileDigests | None = None) -> FileTable:
    """{relative path: {sha256, size}} of every file under root except the manifest; `known`:
    {relative path: sha256} of files this build hashed already (the graphs and their reference
    records), not read again."""
    known = known or {}
    return {
        rel: FileEntry(known.get(rel) or sha256_file(f), f.stat().st_size)
        for f in sorted(root.rglob("*"))
        if f.is_file() and (rel := str(f.relative_to(root))) != MANIFEST
    }


@dataclasses.dataclass(frozen=True)
class GraphDigests:
    """A graph file's sha256 (the manifest's integrity hash) and md5 (the hash DVC records for it in
    dvc.lock, which ties the release back to the stage that made it)."""

    sha256: str
    md5: str


def graph_digests(path: Path) -> GraphDigests:
    """A graph's GraphDigests, from one read."""
    return GraphDigests(**file_digests(path, ("sha256", "md5")))


# zstd level 1: a release is mostly fp32 weights widened from bf16; on a real-width graph level 1
# keeps fewer bytes than gzip's level 1 at several times its speed (docs/release.md, "The release"), and zstd's
# multithreaded mode uses every core. Its output does not depend on the number of workers, so the
# tarball is byte-identical on any machine (tests/test_release.py).
TARBALL_SUFFIX = ".tar.zst"
ZSTD_LEVEL = 1


def compressor(workers: int | None = None):
    import zstandard

    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=workers or os.cpu_count() or 1, write_checksum=True)


def write_tarball(src: Path, dest: Path, top: str, workers: int | None = None) -> None:
    """A byte-reproducible .tar.zst of src under directory `top`: sorted members, zero times and
    owners, fixed modes. Streamed: members are read in chunks and never held whole (a release holds
    graphs of many GB)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic.writing(dest) as raw,
        compressor(workers).stream_writer(raw, closefd=False) as zst,
        tarfile.open(fileobj=zst, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for f in sorted(src.rglob("*")):
            info = tarfile.TarInfo(f"{top}/{f.relative_to(src)}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if f.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = f.stat().st_size, 0o644
                with open(f, "rb") as fh:
                    tar.addfile(info, fh)


@contextlib.contextmanager
def open_tarball(path: Path):
    """A release tarball opened for reading, as a streaming tarfile (members in order)."""
    import zstandard

    with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zst:
        with tarfile.open(fileobj=zst, mode="r|") as tar:
            yield tar
