"""Who produced an artifact: package versions and the git commit, for metadata and manifests."""
from __future__ import annotations

import subprocess
from importlib import metadata

PACKAGES = ("torch", "transformers", "litert-torch", "ai-edge-litert", "safetensors", "huggingface_hub", "dvc")


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(cwd=".") -> str | None:
    """HEAD of the repository the stage runs in (None outside a git repository)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
