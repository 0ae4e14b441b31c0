"""The release package: what a device team takes away, and the manifest that says what produced it.

    artifacts/release/
      manifest.json          hashes of every file, provenance, signatures, verification figures
      README.md              the model card
      rows/row_L{L}.tflite   row graphs             pairs/pair_P{P}_S{S}.tflite   shared-state pairs
      host/                  config, tokenizer, and embed_tokens + lm_head (bf16 safetensors)
      checks/<name>.safetensors   one reference record per .tflite: its inputs and torch's output

The reference records let `clef verify` re-run every signature on a machine without the checkpoint
and hold the result to the threshold the manifest promises. Everything under `files` is a pure
function of the checkpoint, the code and params.yaml, so a rebuild gives the same hashes; the
run-specific figures (times, dvc.lock hashes of the benchmark results) live only in manifest.json.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath

import torch

from scripts.checkpoint.snapshot import file_digest, sha256_file  # noqa: F401  (sha256_file: part of this module's API)
from scripts.pipeline import atomic, params
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import checkpoint_layout

FORMAT = "clef-litert-release/1"
MANIFEST = "manifest.json"
CARD = "README.md"
HOST_TENSORS = {"embed_tokens": checkpoint_layout.EMBED_TOKENS, "lm_head": checkpoint_layout.LM_HEAD}
HOST_WEIGHTS = "host/model.safetensors"
WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def md5_file(path: Path) -> str:
    """The hash DVC records for a file in dvc.lock, to tie the release back to the stage that made it."""
    return file_digest(path, "md5")


def check_host_weights(mode) -> str:
    return params.SCHEMA["release"]({"host_weights": mode}, "release")["host_weights"]


def tensor_sha256(t: torch.Tensor) -> str:
    """Hash of a tensor's raw bytes (dtype-exact: a bf16 tensor hashes its bf16 bits)."""
    return sha256_bytes(t.contiguous().view(torch.uint8).numpy().tobytes())


def release_name(rec: dict, form: str) -> str:
    """<model>-<revision[:12]>-<form>: what the tarball is called."""
    return f"{rec['repo'].split('/')[-1]}-{rec['revision'][:12]}-{form}"


def place(src: Path, dest: Path) -> None:
    """dest as a hard link to src where the filesystem allows (a 30 GB graph is not copied), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


# ---- host files --------------------------------------------------------------------------------


def host_tables(host) -> dict:
    """{role: tensor} of the host tables a release carries (roles as in HOST_TENSORS)."""
    return {"embed_tokens": host.embed_tokens, "lm_head": host.lm_head}


def host_files(snap: Path, host, dest: Path, mode: str) -> dict:
    """Copy the snapshot's non-weight files (config, tokenizer) to dest/host and, under mode
    `include`, embed_tokens and lm_head as bf16 safetensors; -> the manifest's `host` section."""
    from safetensors.torch import save_file

    check_host_weights(mode)
    (dest / "host").mkdir(parents=True, exist_ok=True)
    for f in sorted(snap.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(f, dest / "host" / f.name)
    index = json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"]
    tables = host_tables(host)
    tensors = {
        role: {
            "key": key,
            "dtype": str(tables[role].dtype).replace("torch.", ""),
            "shape": list(tables[role].shape),
            "sha256": tensor_sha256(tables[role]),
            "source_file": index[key],
        }
        for role, key in HOST_TENSORS.items()
    }
    if mode == "include":
        save_file(
            {key: tables[role].contiguous() for role, key in HOST_TENSORS.items()},
            str(dest / HOST_WEIGHTS),
            metadata={"format": "pt"},
        )
    return {"weights": mode, "tensors": tensors, "weights_file": HOST_WEIGHTS if mode == "include" else None}


# ---- reference records -------------------------------------------------------------------------


def row_reference(graph, record: dict) -> dict:
    """A row graph's reference record: its inputs and torch's hidden states at the real positions."""
    n = int(record["valid"].sum())
    with torch.no_grad():
        expected = graph(**record)["hidden"][:, :n]
    return {**record, "expected": expected.contiguous()}


def pair_reference(row, prefix_record: dict, suffix_record: dict, full_record: dict) -> dict:
    """A pair's reference record: both signatures' token inputs, and the row graph's hidden states
    at the suffix positions (the chaining rule the pair promises)."""
    p, s = int(prefix_record["valid"].sum()), int(suffix_record["valid"].sum())
    with torch.no_grad():
        expected = row(**full_record)["hidden"][:, p : p + s]
    return {
        **{f"prefix.{k}": v for k, v in prefix_record.items()},
        **{f"suffix.{k}": v for k, v in suffix_record.items()},
        "expected": expected.contiguous(),
    }


def reference_error(signature, kind: str, record: dict) -> dict:
    """Run a reference record through a graph's signatures; -> its error against the stored
    expectation, global and per position (scripts/checks/compare.py: rel_vs_expected,
    rel_per_position_vs_expected, inf if an output is not finite). `signature(name)` gives a signature
    (None: the only one) as a callable on named torch tensors returning a dict of them: the
    interpreter's (run_reference) or the GPU accelerator's (scripts/litert/gpu_accelerator.py)."""
    from scripts.checks import compare

    feed = {k: v.to(torch.float32) for k, v in record.items() if k != "expected"}
    expected = record["expected"]
    if kind == "row":
        out = signature(None)(**feed)["hidden"]
    elif kind == "pair":
        first = signature("prefix")(**{k[7:]: v for k, v in feed.items() if k.startswith("prefix.")})
        state = {k: v for k, v in first.items() if k != "hidden"}
        tokens = {k[7:]: v for k, v in feed.items() if k.startswith("suffix.")}
        out = signature("suffix")(**tokens, **state)["hidden"]
    else:
        raise ClefError(f"unknown artifact kind {kind!r}")
    return compare.figures("vs_expected", out[:, : expected.shape[1]], expected)


def reference_problems(figures: dict, reference: dict) -> list[str]:
    """A reference record's figures against the bounds the manifest's `reference` entry states (a
    release made before per-position bounds states the global one only)."""
    from scripts.checks import compare

    bounds = {"rel_vs_expected": reference["threshold"]}
    if "threshold_per_position" in reference:
        bounds["rel_per_position_vs_expected"] = reference["threshold_per_position"]
    return compare.judge([figures], bounds)


def run_reference(path: Path, kind: str, record: dict, threads: int | None = None) -> dict:
    """reference_error in the LiteRT interpreter."""
    from scripts.checks.tflite_check import interpreter
    from scripts.qwen35.host import litert_signature

    interp = interpreter(path, threads)
    return reference_error(
        lambda name: litert_signature(interp.get_signature_runner(*([name] if name else []))), kind, record
    )


# ---- manifest ----------------------------------------------------------------------------------


def signatures(census: dict, contract: dict) -> dict:
    """Each signature's inputs and outputs as the file has them (name, shape, dtype), with the
    contract's meaning beside each; the file is the authority on shapes, the contract on meaning."""
    declared = contract.get("signatures") or {
        "serving_default": {"inputs": contract["inputs"], "outputs": contract["outputs"]}
    }
    out = {}
    for sig, io_ in census["signatures"].items():
        meanings = {
            e["name"]: e["meaning"] for side in ("inputs", "outputs") for e in declared.get(sig, {}).get(side, [])
        }
        out[sig] = {
            side: [{**e, "meaning": meanings.get(e["name"])} for e in sorted(io_[side], key=lambda e: e["name"])]
            for side in ("inputs", "outputs")
        }
    return out


def lock_stages(path: Path = Path("dvc.lock")) -> dict:
    """Every stage's entry in dvc.lock as {stage: {cmd, deps, outs, params}} with md5 per path.
    Read, not declared as a dependency: DVC rewrites it after each stage, so under `dvc repro` it
    holds every upstream stage's hashes by the time the release runs."""
    import yaml

    if not path.is_file():
        return {}
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})

    def hashes(entries):
        return {e["path"]: e.get("md5") for e in entries or []}

    return {
        name: {
            "cmd": st.get("cmd"),
            "deps": hashes(st.get("deps")),
            "outs": hashes(st.get("outs")),
            "params": st.get("params", {}),
        }
        for name, st in sorted(stages.items())
        if name != "release"
    }


def file_table(root: Path) -> dict:
    """{relative path: {sha256, size}} of every file under root except the manifest."""
    return {
        str(f.relative_to(root)): {"sha256": sha256_file(f), "size": f.stat().st_size}
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.relative_to(root) != Path(MANIFEST)
    }


# gzip level 1: a release is mostly fp32 weights widened from bf16, whose zero low halves every level
# finds; higher levels gain little and cost hours on clef-flash's graphs (README, "The release").
GZIP_LEVEL = 1


def write_tarball(src: Path, dest: Path, top: str) -> None:
    """A byte-reproducible .tar.gz of src under directory `top`: sorted members, zero times and
    owners, fixed modes, a gzip header without name or time. Streamed: members are read in chunks and
    never held whole (a release holds graphs of many GB)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic.writing(dest) as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
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


# ---- reading a release (clef verify / run / audit) ---------------------------------------------


def expected_metadata(manifest: dict, artifact: dict) -> dict:
    """What a release's graph must say of itself (tflite_file.read_metadata) given its manifest entry."""
    return {
        "revision": manifest["model"]["revision"],
        "form": manifest["form"],
        "kind": artifact["kind"],
        **{k: artifact[k] for k in ("L", "P", "S") if k in artifact},
    }


def load_manifest(root: Path) -> dict:
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise ClefError(f"{root} is not a release: no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ClefError(f"{path} is not valid JSON: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise ClefError(f"{path}: format {manifest.get('format')!r}, this clef reads {FORMAT}")
    return manifest


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


def check_paths(root: Path, manifest: dict) -> list[str]:
    """Every path the manifest names (`files`, the `artifacts` keys, the reference records) must lie
    inside the release and be listed in `files` with its hash: one line per path that does not.
    Checked before anything is hashed or loaded, so no path can make clef read outside the release."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        return ["manifest: `files` is not a table of the release's files"]
    problems = [f"manifest path {name!r} {why}" for name in files if (why := outside(root, name))]
    artifacts = manifest.get("artifacts")
    if not isinstance(artifacts, dict):
        return problems + ["manifest: `artifacts` is not a table of the release's graphs"]
    for name, art in artifacts.items():
        reference = art.get("reference", {}).get("file") if isinstance(art, dict) else None
        for what, path in (("graph", name), ("reference record", reference)):
            why = outside(root, path)
            if why:
                problems.append(f"manifest {what} path {path!r} {why}")
            elif path not in files:
                problems.append(f"manifest {what} path {path!r} is not listed in `files` (its hash is unknown)")
    return problems


def check_files(root: Path, manifest: dict) -> list[str]:
    """Problems with the files themselves, one line each: missing, changed (size or sha256), extra."""
    root = Path(root)
    listed = manifest["files"]
    present = {
        str(f.relative_to(root)) for f in root.rglob("*") if f.is_file() and f.relative_to(root) != Path(MANIFEST)
    }
    problems = [f"missing file: {name}" for name in sorted(set(listed) - present)]
    for name in sorted(set(listed) & present):
        f = root / name
        if f.stat().st_size != listed[name]["size"] or sha256_file(f) != listed[name]["sha256"]:
            problems.append(f"changed file: {name} (sha256 differs from the manifest)")
    problems += [f"extra file: {name} (not in the manifest)" for name in sorted(present - set(listed))]
    return problems


def load_reference(root: Path, name: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(root) / name))
