"""Shared fixtures: the tiny checkpoint written once per session, and a way to run a stage as DVC does."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import scripts  # noqa: F401  (quiets third-party import noise before torch/transformers load)
from scripts import fetch, snapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> tuple[Path, dict]:
    """A read-only-by-convention hf/ cache holding the tiny checkpoint, and its file record."""
    cache = tmp_path_factory.mktemp("tiny") / "hf"
    repo, revision = fetch.write_tiny(cache)
    rec = snapshot.record(snapshot.snapshot_dir(cache, repo, revision), "tiny", repo, revision, root=cache.parent)
    return cache, rec


@pytest.fixture(scope="session")
def tiny_snapshot(tiny_cache) -> Path:
    cache, rec = tiny_cache
    return cache.parent / rec["path"]


@pytest.fixture
def workdir(tmp_path, tiny_cache) -> Path:
    """A stage working directory with its own copy of the tiny snapshot, record and params."""
    cache, rec = tiny_cache
    shutil.copytree(cache, tmp_path / "hf")
    (tmp_path / "results").mkdir()
    from scripts import atomic

    atomic.write_json(tmp_path / "results" / "snapshot.json", rec)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def run_stage(name: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m stages.<name>` in `cwd`, the way dvc.yaml runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """The stage failed with exit 2 and exactly one stderr line, `error: ...`, holding every fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
