"""Who produced an artifact: package versions and the git state, for metadata and manifests."""

from __future__ import annotations

import subprocess
from importlib import metadata

PACKAGES = ("torch", "transformers", "litert-torch", "ai-edge-litert", "safetensors", "huggingface_hub", "dvc")
# What a stage runs from. dvc.lock and the .gitignore files DVC edits change during every
# `dvc repro`, so they do not make a tree unclean; a change to any of these does.
PIPELINE_INPUTS = ("dvc.yaml", "params.yaml", "requirements.txt", "scripts", "stages")


def package_versions() -> dict:
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


def git_state(cwd=".") -> dict:
    """{"commit", "clean", "changed"}: HEAD, and whether the pipeline's inputs differ from it
    (uncommitted or untracked files under PIPELINE_INPUTS; `clean` is None outside git)."""
    commit = git_commit(cwd)
    if commit is None:
        return {"commit": None, "clean": None, "changed": []}
    out = _git("status", "--porcelain", "--untracked-files=all", "--", *PIPELINE_INPUTS, cwd=cwd) or ""
    changed = sorted(line[3:] for line in out.splitlines() if line.strip())
    return {"commit": commit, "clean": not changed, "changed": changed}
