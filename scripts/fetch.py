"""Write the checkpoint snapshot into hf/: the embedded tiny checkpoint, or a hub download.

Either way the snapshot is built under `hf.partial/` and swapped in whole, so a fetch killed
midway leaves no hf/ that DVC could take for a finished output. The partial directory of a hub
download is kept between attempts, so an interrupted download resumes instead of restarting.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from scripts import atomic
from scripts.errors import ClefError
from scripts.snapshot import record, snapshot_dir

# The files the pipeline needs from a hub repository: config, safetensors weights, tokenizer.
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                "special_tokens_map.json", "chat_template.jinja"]


def write_tiny(cache: Path) -> tuple[str, str]:
    """Write the embedded tiny checkpoint into cache root `cache`; -> (repo, revision)."""
    from scripts import tiny_checkpoint  # imported here: it loads transformers

    content = tiny_checkpoint.files()
    revision = tiny_checkpoint.revision(content)
    target = snapshot_dir(cache, tiny_checkpoint.REPO, revision)
    target.mkdir(parents=True)
    for name, data in content.items():
        (target / name).write_bytes(data)
    # The cache's ref file, as huggingface_hub writes it for a downloaded revision.
    ref = target.parents[1] / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text(revision)
    return tiny_checkpoint.REPO, revision


def download_hub(cache: Path, repo: str, revision: str) -> tuple[str, str]:
    """Download `repo` at the pinned `revision` (safetensors and tokenizer files only) into `cache`."""
    import httpx
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RevisionNotFoundError

    try:
        path = snapshot_download(repo_id=repo, revision=revision, cache_dir=str(Path(cache) / "hub"),
                                 allow_patterns=HUB_PATTERNS)
    except RevisionNotFoundError:
        raise ClefError(f"revision {revision} not found in {repo}") from None
    except (HfHubHTTPError, LocalEntryNotFoundError, httpx.HTTPError, OSError) as exc:
        raise ClefError(f"download of {repo}@{revision} failed: {str(exc).splitlines()[0]}") from None
    names = {p.name for p in Path(path).iterdir()}
    if not ({"model.safetensors", "model.safetensors.index.json"} & names):
        raise ClefError(f"{repo}@{revision} has no safetensors weights (pickle checkpoints are refused)")
    return repo, revision


def fetch(model: dict, cache: Path = Path("hf")) -> dict:
    """Build the snapshot for params `model` under `cache` atomically; -> its file record."""
    cache = Path(cache)
    partial = atomic.partial_dir(cache)
    if model["source"] == "tiny":
        if partial.exists():  # a tiny snapshot is cheap to redo: start clean
            shutil.rmtree(partial)
        repo, revision = write_tiny(partial)
    elif model["source"] == "hub":  # a kept partial directory lets an interrupted download resume
        repo, revision = download_hub(partial, model["repo"], model["revision"])
    else:
        raise ClefError(f"unknown model.source {model['source']!r}")
    atomic.swap_in_dir(partial, cache)
    return record(snapshot_dir(cache, repo, revision), model["source"], repo, revision)
