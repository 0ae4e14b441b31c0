"""Who produced an artifact: package versions and the git state, for metadata and manifests."""

from __future__ import annotations

import dataclasses
import subprocess
from importlib import metadata

from scripts.pipeline.records import Record

PACKAGES = ("torch", "transformers", "litert-torch", "ai-edge-litert", "safetensors", "huggingface_hub", "dvc")
# What a stage runs from. dvc.lock and the .gitignore files DVC edits change during every
# `dvc repro`, so they do not make a tree unclean; a change to any of these does.
PIPELINE_INPUTS = ("dvc.yaml", "params.yaml", "requirements.txt", "scripts", "stages")


def package_versions() -> dict[str, str | None]:
    """{package: installed version, or None} for PACKAGES."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(*args: str, cwd=".") -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def git_commit(cwd=".") -> str | None:
    """HEAD of the repository the stage runs in (None outside a git repository)."""
    out = _git("rev-parse", "HEAD", cwd=cwd)
    return out.strip() if out else None


@dataclasses.dataclass(frozen=True)
class GitState(Record):
    """The revision of this repository an artifact was made at: a graph's metadata and the manifest
    carry it as `git`."""

    commit: str | None  # HEAD; None outside a git repository
    clean: bool | None  # no uncommitted or untracked change under PIPELINE_INPUTS; None outside git
    changed: list[str]  # those changes' paths


def git_state(cwd=".") -> GitState:
    """HEAD, and whether the pipeline's inputs differ from it."""
    commit = git_commit(cwd)
    if commit is None:
        return GitState(None, None, [])
    out = _git("status", "--porcelain", "--untracked-files=all", "--", *PIPELINE_INPUTS, cwd=cwd) or ""
    changed = sorted(line[3:] for line in out.splitlines() if line.strip())
    return GitState(commit, not changed, changed)
