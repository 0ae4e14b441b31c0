"""The fetch stage's hub download against a fake hub on loopback (tests/hub_server.py).

The stage runs as DVC runs it, `python -m stages.fetch` in a fresh directory, with HF_ENDPOINT
pointing at the fake hub (huggingface_hub reads it at import, hence the subprocess). The hub serves
the tiny checkpoint at any 40-hex revision; its fault switches stand for a transfer cut midway, a
corrupt file, an unknown revision and a file too big for the disk.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scripts.checkpoint.fetch import DISK_MARGIN, HUB_PATTERNS, bytes_left
from tests.conftest import ROOT, assert_one_line_error
from tests.hub_server import FakeHub, git_blob_id

REVISION = "0123456789abcdef0123456789abcdef01234567"
FOREVER = 10**6  # cut every GET of the file until the test mends the hub


MODEL_CARD = b"---\nlicense: apache-2.0\nbase_model: Qwen/Qwen3.5-9B\n---\n# tiny\n"


@pytest.fixture
def tiny_files(tiny_cache) -> tuple[str, dict[str, bytes]]:
    """The tiny checkpoint as the hub holds it, with a model card: (repo, {name: bytes})."""
    cache, rec = tiny_cache
    snapshot = cache.parent / rec.path
    files = {f.name: (snapshot / f.name).read_bytes() for f in rec.files}
    return rec.repo, {**files, "README.md": MODEL_CARD}


@pytest.fixture
def hub(tiny_files):
    """The fake hub, also holding a file the pipeline must not download: a pickle."""
    repo, files = tiny_files
    server = FakeHub(repo, {**files, "pytorch_model.bin": b"\x80\x04 a pickle"})
    yield server
    server.close()


@pytest.fixture
def work(tmp_path, tiny_files):
    """A stage directory whose params.yaml asks for the tiny repo from the hub at REVISION."""
    work = tmp_path / "work"
    work.mkdir()
    model = {"source": "hub", "repo": tiny_files[0], "revision": REVISION}
    memory = yaml.safe_load((ROOT / "params.yaml").read_text())["memory"]  # every stage's budget
    (work / "params.yaml").write_text(yaml.safe_dump({"model": model, "memory": memory}))
    return work


def hub_env(work, hub) -> dict:
    """The environment of a run online against the fake hub, with a private HF_HOME (no token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"}
    env.update(
        PYTHONPATH=str(ROOT),
        HF_ENDPOINT=hub.url,
        HF_HOME=str(work.parent / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


def run_fetch(work, hub) -> subprocess.CompletedProcess:
    """The fetch stage in `work`, as DVC runs it, against the fake hub."""
    return subprocess.run(
        [sys.executable, "-m", "stages.fetch"],
        cwd=work,
        env=hub_env(work, hub),
        capture_output=True,
        text=True,
        timeout=120,
    )


def wanted(files: dict[str, bytes]) -> dict[str, bytes]:
    return {n: data for n, data in files.items() if any(fnmatch.fnmatch(n, p) for p in HUB_PATTERNS)}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shards(files) -> list[str]:
    return sorted(n for n in files if n.endswith(".safetensors"))


def assert_snapshot(work, proc, repo, files) -> None:
    """The stage succeeded, and hf/ and its record hold exactly the hub's wanted files, byte for byte."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads((work / "results" / "snapshot.json").read_text())
    assert (rec["source"], rec["repo"], rec["revision"]) == ("hub", repo, REVISION)
    expected = wanted(files)
    assert {f["name"]: f["sha256"] for f in rec["files"]} == {n: sha256(d) for n, d in expected.items()}
    snapshot = work / rec["path"]
    assert snapshot.parent.name == "snapshots" and snapshot.name == REVISION
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == expected
    assert not (work / "hf.partial").exists()


def assert_not_written(work) -> None:
    """No hf/ that DVC could take for a finished output, and no record."""
    assert not (work / "hf").exists() and not (work / "results").exists(), sorted(p.name for p in work.iterdir())


def test_pinned_revision_downloads_the_wanted_files(work, hub, tiny_files):
    repo, files = tiny_files
    assert_snapshot(work, run_fetch(work, hub), repo, files)
    asked = {path.rsplit("/", 1)[1] for _, path, _ in hub.resolves("GET")}
    assert asked == set(wanted(files))  # every wanted file fetched; the pickle never asked for
    assert "README.md" in asked  # the model card: the release's card carries its license


def test_missing_revision_is_one_line_and_writes_nothing(work, hub, tiny_files):
    hub.missing_revisions.add(REVISION)
    assert_one_line_error(run_fetch(work, hub), f"revision {REVISION} not found in {tiny_files[0]}")
    assert_not_written(work)
    assert hub.resolves("HEAD") == [] and hub.resolves("GET") == []


def test_pickle_only_repo_refused_before_any_download(work, tiny_files):
    server = FakeHub(tiny_files[0], {"config.json": tiny_files[1]["config.json"], "pytorch_model.bin": b"\x80\x04"})
    try:
        assert_one_line_error(run_fetch(work, server), "has no safetensors weights", "pickle")
        assert server.resolves("GET") == []
    finally:
        server.close()
    assert_not_written(work)


@pytest.mark.parametrize("cuts", [1, FOREVER], ids=["cut-once", "cut-every-try"])
def test_cut_transfer_ends_in_a_correct_snapshot_or_a_clean_failure(work, hub, tiny_files, cuts):
    """A shard's connection drops halfway. Whatever huggingface_hub makes of it (a retry in-process, or
    giving up), the stage either writes a correct snapshot or fails in one line without hf/; at most
    one rerun finishes the download."""
    repo, files = tiny_files
    shard = shards(files)[0]
    hub.cut[shard] = [len(files[shard]) // 2, cuts]
    first = run_fetch(work, hub)
    assert hub.cuts_done >= 1  # the fault did happen
    if cuts == FOREVER:  # no retry can get through: the attempt must give up, cleanly
        assert_one_line_error(first, f"download of {repo}@{REVISION} failed")
        hub.cut.clear()  # the network mends
    if first.returncode == 0:
        assert_snapshot(work, first, repo, files)
        return
    assert_one_line_error(first, "failed")
    assert_not_written(work)
    assert_snapshot(work, run_fetch(work, hub), repo, files)


# (fault, file it hits, what the one-line error must say given the file's true bytes)
CORRUPTIONS = {
    "flipped-shard": (
        "flip",
        lambda files: shards(files)[-1],
        lambda data: f"sha256 {sha256(flipped(data))[:12]}... differs from the hub's {sha256(data)[:12]}",
    ),
    "flipped-small-file": (
        "flip",
        lambda files: "tokenizer.json",
        lambda data: (
            f"git blob sha1 {git_blob_id(flipped(data))[:12]}... differs from the hub's {git_blob_id(data)[:12]}"
        ),
    ),
    "truncated-shard": (
        "truncate",
        lambda files: shards(files)[0],
        lambda data: f"it has {len(data) // 2} bytes where the hub lists {len(data)}",
    ),
}


def flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_file_refused_and_not_trusted_by_the_rerun(work, hub, tiny_files, case):
    """The hub serves bad bytes for one file while its listing keeps the true size and hash: the stage
    fails in one line naming the file, writes no hf/, and drops the file so the rerun fetches it again."""
    repo, files = tiny_files
    fault, pick, says = CORRUPTIONS[case]
    name = pick(files)
    getattr(hub, fault).add(name)
    assert_one_line_error(run_fetch(work, hub), f"downloaded {name} ", "is corrupt", says(files[name]))
    assert_not_written(work)
    storage = work / "hf.partial" / "hub" / f"models--{repo.replace('/', '--')}"
    etag = sha256(files[name]) if name.endswith(".safetensors") else git_blob_id(files[name])
    assert (storage / "snapshots" / REVISION / "config.json").is_file()  # the good files are kept ...
    assert not (storage / "snapshots" / REVISION / name).exists()  # ... the bad one is gone, blob and all
    assert not (storage / "blobs" / etag).exists()

    getattr(hub, fault).clear()
    fetched = len(hub.resolves("GET", name))
    assert_snapshot(work, run_fetch(work, hub), repo, files)
    assert len(hub.resolves("GET", name)) == fetched + 1  # downloaded again, not taken from the partial dir
    assert len(hub.resolves("GET", "config.json")) == 1  # while a good file was not


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("config.json", b'{"text_config": {"hidden_size": 128,', "config.json is not valid JSON"),
        (
            "config.json",
            b'{"text_config": {"hidden_size": 128}}',
            "max_position_embeddings None is not a positive integer",
        ),
        ("tokenizer_config.json", b"{not json", "tokenizer_config.json is not valid JSON"),
    ],
)
def test_unreadable_snapshot_json_refused_by_fetch(work, tiny_files, name, content, fragment):
    """Issue 15 case 6: the hub's config.json or tokenizer config does not parse (the hub's listing
    agrees with the bytes, so the download itself is sound). The fetch stage refuses it in one line,
    exit 2, and the previous hf/ and record stay as they were: no later stage ever sees it."""
    repo, files = tiny_files
    previous = {work / "hf" / "kept.txt": b"the last good snapshot", work / "results" / "snapshot.json": b"{}"}
    for path, data in previous.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    server = FakeHub(repo, {**files, name: content})
    try:
        assert_one_line_error(run_fetch(work, server), name, fragment)
    finally:
        server.close()
    assert {path: path.read_bytes() for path in previous} == previous
    assert sorted(p.name for p in (work / "hf").iterdir()) == ["kept.txt"]


def test_no_room_refused_before_any_download(work, hub, tiny_files):
    repo, files = tiny_files
    huge = 10**15  # 1 PB
    hub.sizes[shards(files)[0]] = huge
    line = assert_one_line_error(run_fetch(work, hub), f"for {repo}@{REVISION[:12]}", "free space or move the cache")
    free = shutil.disk_usage(work).free / 1e9
    m = re.search(
        r"fetch needs ([\d.]+) GB free .*\(([\d.]+) GB of .* left to download, ([\d.]+) GB margin\), "
        r"(\S+) has ([\d.]+) GB",
        line,
    )
    assert m, line
    needs, left, margin, where, has = float(m[1]), float(m[2]), float(m[3]), m[4], float(m[5])
    expected_left = (huge + sum(len(d) for n, d in wanted(files).items() if n != shards(files)[0])) / 1e9
    assert abs(left - expected_left) <= 0.05 and abs(margin - DISK_MARGIN / 1e9) <= 0.05
    assert abs(needs - (left + margin)) <= 0.1
    assert where == str(work) and abs(has - free) <= max(2.0, free / 50)  # the disk is shared: slack
    assert hub.resolves("HEAD") == [] and hub.resolves("GET") == []  # refused before touching a file
    assert_not_written(work)
    assert not (work / "hf.partial").exists()


def test_bytes_left_counts_files_a_kept_partial_dir_already_holds(tmp_path):
    """The room check asks only for what a rerun will really download."""
    from huggingface_hub.hf_api import BlobLfsInfo, RepoSibling

    shard, config = b"s" * 1000, b"{}"
    sha = sha256(shard)
    listed = {
        "model.safetensors": RepoSibling("model.safetensors", 1000, "x" * 40, BlobLfsInfo(1000, sha, 134)),
        "config.json": RepoSibling("config.json", 2, git_blob_id(config)),
    }
    storage = tmp_path / "models--org--name"
    assert bytes_left(storage, REVISION, listed) == 1002
    (storage / "blobs").mkdir(parents=True)
    (storage / "blobs" / sha).write_bytes(shard)  # a finished blob, its snapshot link not made yet
    assert bytes_left(storage, REVISION, listed) == 2
    (storage / "snapshots" / REVISION).mkdir(parents=True)
    (storage / "snapshots" / REVISION / "config.json").write_bytes(config)
    assert bytes_left(storage, REVISION, listed) == 0


def fill_user_cache(work, hub, repo) -> Path:
    """The user's own Hugging Face cache (HF_HOME/hub), filled as `hf download` fills it; -> its snapshot."""
    code = f"from huggingface_hub import snapshot_download as d; print(d({repo!r}, revision={REVISION!r}))"
    proc = subprocess.run([sys.executable, "-c", code], env=hub_env(work, hub), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    snapshot = Path(proc.stdout.strip().splitlines()[-1])
    assert snapshot.is_relative_to(work.parent / "hf-home" / "hub"), snapshot
    hub.requests.clear()
    return snapshot


def cache_state(snapshot: Path) -> dict:
    """Every file of the user's cache snapshot: (its bytes, its blob's inode)."""
    return {p.name: (p.read_bytes(), p.stat().st_ino) for p in snapshot.iterdir()}


def test_a_filled_hugging_face_cache_downloads_nothing(work, hub, tiny_files):
    """The user already holds the pinned revision in their Hugging Face cache: fetch checks and copies it,
    asks the hub for no file, and leaves the user's cache as it was (copies, not links, into hf/)."""
    repo, files = tiny_files
    theirs = fill_user_cache(work, hub, repo)
    before = cache_state(theirs)
    proc = run_fetch(work, hub)
    assert_snapshot(work, proc, repo, files)
    assert hub.resolves("GET") == [] and hub.resolves("HEAD") == []  # no shard, no file at all
    n = len(wanted(files))
    assert f"fetch: {n} of {n} files" in proc.stdout and "copied from the Hugging Face cache" in proc.stdout
    assert cache_state(theirs) == before
    ours = {p.stat().st_ino for p in (work / "hf").rglob("*") if p.is_file()}
    assert not ours & {ino for _, ino in before.values()}


USER_CACHE_FAULTS = {  # what a user's cache can hold instead of the hub's bytes, and the line naming it
    "flipped-shard": (flipped, lambda data: f"sha256 {sha256(flipped(data))[:12]}... differs from the hub's"),
    "truncated-shard": (
        lambda data: data[: len(data) // 2],
        lambda data: f"it has {len(data) // 2} bytes where the hub lists {len(data)}",
    ),
}


@pytest.mark.parametrize("case", sorted(USER_CACHE_FAULTS) + ["missing-shard"])
def test_a_bad_or_missing_file_in_the_hugging_face_cache_is_downloaded(work, hub, tiny_files, case):
    """One shard of the user's cache is not the hub's (or absent): it alone is downloaded, named when bad,
    and the user's copy is left as it was; every good file is copied, not downloaded."""
    repo, files = tiny_files
    theirs = fill_user_cache(work, hub, repo)
    bad = shards(files)[-1]
    blob = (theirs / bad).resolve()
    if case == "missing-shard":
        (theirs / bad).unlink()
        blob.unlink()
    else:
        spoil, says = USER_CACHE_FAULTS[case]
        blob.chmod(0o644)
        blob.write_bytes(spoil(files[bad]))
    before = cache_state(theirs)
    proc = run_fetch(work, hub)
    assert_snapshot(work, proc, repo, files)
    assert {path.rsplit("/", 1)[1] for _, path, _ in hub.resolves("GET")} == {bad}
    if case != "missing-shard":
        assert f"fetch: {bad} in the Hugging Face cache" in proc.stdout and says(files[bad]) in proc.stdout
    n = len(wanted(files))
    assert f"fetch: {n - 1} of {n} files" in proc.stdout
    assert cache_state(theirs) == before
