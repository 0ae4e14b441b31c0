"""Write the checkpoint snapshot into hf/: the embedded tiny checkpoint, the real-width synthetic
one (scripts/checkpoint/synthetic_checkpoint.py), or a hub download.

Either way the snapshot is built under `hf.partial/` and swapped in whole, so a fetch killed
midway leaves no hf/ that DVC could take for a finished output. The partial directory of a hub
download is kept between attempts, so the files an interrupted download finished are not fetched
again (huggingface_hub retries a cut transfer itself; a file it gave up on starts over).

A hub download first asks the hub for the file list at the pinned revision and refuses to start
when the repository has no safetensors weights, or when the disk cannot hold what is left to
download plus a margin (`DISK_MARGIN`). Files the user's own Hugging Face cache (`HF_HUB_CACHE`,
`HF_HOME`) holds at that revision are checked against the list (size, then huggingface_hub's
`verify_repo_checksums`) and copied, never linked: hf/ is the pipeline's to replace, the user's cache
is not. huggingface_hub downloads the rest. Then every file is checked against the list again; a
file that fails is deleted from the partial directory, so the next attempt downloads it again
instead of trusting it, and no hf/ is written.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts.checkpoint.snapshot import SnapshotRecord, check_readable, record, sha256_file, snapshot_dir
from scripts.pipeline import atomic
from scripts.pipeline.errors import ClefError, first_of

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoSibling

HubFiles = dict[str, "RepoSibling"]
"""A snapshot file's name -> the hub's entry for it (size, blob_id, lfs), as the hub lists it."""

# The files the pipeline needs from a hub repository: config, safetensors weights, tokenizer, and the model
# card (README.md), whose license and base model the release's card carries.
HUB_PATTERNS = [
    "README.md",
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.jinja",
]
# Room left free beyond the download itself: the disk also holds the record, DVC's bookkeeping and the
# later stages' outputs, and a disk filled to the last byte fails far from the fetch that filled it.
DISK_MARGIN = 1 << 30  # 1 GiB


def write_tiny(cache: Path) -> tuple[str, str]:
    """Write the embedded tiny checkpoint into cache root `cache`; -> (repo, revision)."""
    from scripts.checkpoint import tiny_checkpoint  # imported here: it loads transformers

    content = tiny_checkpoint.files()
    revision = tiny_checkpoint.revision(content)
    target = snapshot_dir(cache, tiny_checkpoint.REPO, revision)
    target.mkdir(parents=True)
    for name, data in content.items():
        (target / name).write_bytes(data)
    write_ref(target, revision)
    return tiny_checkpoint.REPO, revision


def write_ref(snapshot: Path, revision: str) -> None:
    """The cache's ref file, as huggingface_hub writes it for a downloaded revision."""
    ref = snapshot.parents[1] / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text(revision)


def write_synthetic(cache: Path, layers: int) -> tuple[str, str]:
    """Write the real-width synthetic checkpoint with `layers` decoder layers into cache root `cache`."""
    from scripts.checkpoint import synthetic_checkpoint

    staging = Path(cache) / "staging"
    revision = synthetic_checkpoint.write(staging, layers)  # the revision names the content: known last
    target = snapshot_dir(cache, synthetic_checkpoint.REPO, revision)
    target.parent.mkdir(parents=True)
    staging.rename(target)
    write_ref(target, revision)
    return synthetic_checkpoint.REPO, revision


def download_hub(cache: Path, repo: str, revision: str) -> tuple[str, str]:
    """Download `repo` at the pinned `revision` (safetensors and tokenizer files only) into cache root
    `cache`, after checking the disk has room for it; check every file against the hub's list."""
    from huggingface_hub import HfApi, snapshot_download

    cache = Path(cache)
    storage = snapshot_dir(cache, repo, revision).parents[1]
    _hub_log_to_stdout()
    with _hub_errors(repo, revision):
        listed = hub_files(HfApi().model_info(repo, revision=revision, files_metadata=True).siblings or [])
    if not ({"model.safetensors", "model.safetensors.index.json"} & set(listed)):
        raise ClefError(f"{repo}@{revision} has no safetensors weights (pickle checkpoints are refused)")
    check_room(cache, storage, repo, revision, listed)
    copy_from_user_cache(storage, repo, revision, listed)
    with _hub_errors(repo, revision):
        path = snapshot_download(
            repo_id=repo,
            revision=revision,
            cache_dir=str(cache / "hub"),
            allow_patterns=HUB_PATTERNS,
            tqdm_class=_stdout_tqdm(),
        )
    check_download(Path(path), repo, revision, listed)
    return repo, revision


def hub_files(siblings: list[RepoSibling]) -> HubFiles:
    """name -> the hub's entry (size, blob_id, lfs) of every listed file snapshot_download will fetch."""
    from huggingface_hub.utils import filter_repo_objects  # the very filter snapshot_download applies

    by_name = {s.rfilename: s for s in siblings}
    return {name: by_name[name] for name in filter_repo_objects(list(by_name), allow_patterns=HUB_PATTERNS)}


def listed_size(entry: RepoSibling) -> int | None:
    return entry.lfs.size if entry.lfs is not None else entry.size


def bytes_left(storage: Path, revision: str, listed: HubFiles) -> int:
    """Bytes of `listed` files still to download (or copy) into the cache folder `storage` of the repository."""
    return sum(max(0, (listed_size(e) or 0) - held(storage, revision, n, e)) for n, e in listed.items())


def held(storage: Path, revision: str, name: str, entry: RepoSibling) -> int:
    """Bytes of file `name` the cache folder `storage` already holds: its snapshot entry's or its blob's
    (named by its etag: the LFS sha256, else the git blob id), which snapshot_download links without
    fetching it again; 0 when it holds neither."""
    etag = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
    candidates = [storage / "snapshots" / revision / name] + ([storage / "blobs" / etag] if etag else [])
    return next((p.stat().st_size for p in candidates if p.is_file()), 0)


def check_room(cache: Path, storage: Path, repo: str, revision: str, listed: HubFiles) -> None:
    """Refuse to start a download the disk holding `cache` has no room for (plus DISK_MARGIN)."""
    # A killed attempt leaves its temporary files behind; huggingface_hub names them per process
    # and never resumes them, so they only take room.
    for stale in (storage / "blobs").glob("*.incomplete"):
        stale.unlink(missing_ok=True)
    left = bytes_left(storage, revision, listed)
    where = Path(cache).absolute()
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if left + DISK_MARGIN > free:
        raise ClefError(
            f"fetch needs {gb(left + DISK_MARGIN)} free for {repo}@{revision[:12]} ({gb(left)} of "
            f"safetensors + tokenizer files left to download, {gb(DISK_MARGIN)} margin), {where} has "
            f"{gb(free)}: free space or move the cache"
        )


def check_download(snapshot: Path, repo: str, revision: str, listed: HubFiles) -> None:
    """Check the downloaded files against the hub's list (`problems`).

    huggingface_hub checks a transfer's length but no hash, and trusts a blob already in the cache:
    a file that fails here is deleted (snapshot entry and blob) so the next attempt fetches it again.
    """
    bad = {name: "missing after the download" for name in sorted(listed) if not (snapshot / name).is_file()}
    bad.update(problems(snapshot, repo, revision, {n: e for n, e in listed.items() if n not in bad}))
    if bad:
        for name in bad:
            forget(snapshot / name)
        raise ClefError(
            f"downloaded {next(iter(bad))} of {repo}@{revision[:12]} is corrupt: {first_of(list(bad.values()))}; "
            f"the file was removed from {snapshot.parents[3].name}/, so a rerun downloads it again"
        )


# huggingface_hub's names for the two hashes the hub lists, in the words of our messages
HASH_NAMES = {"sha256": "sha256", "git-sha1": "git blob sha1"}


def problems(folder: Path, repo: str, revision: str, listed: HubFiles) -> dict[str, str]:
    """name -> what is wrong, for each `listed` file in `folder` that is not the hub's: its size first
    (cheap, and the clearer line), then its sha256 (LFS files) or git blob id through huggingface_hub's
    `verify_repo_checksums`, run over a folder linking only these files so nothing else is hashed."""
    from huggingface_hub import HfApi

    bad = {}
    for name, entry in sorted(listed.items()):
        size, want = (folder / name).stat().st_size, listed_size(entry)
        if want is not None and size != want:
            bad[name] = f"it has {size} bytes where the hub lists {want}"
    hashed = sorted(set(listed) - set(bad))
    if not hashed:
        return bad
    with tempfile.TemporaryDirectory(prefix="verify-", dir=folder.parents[3]) as links:
        for name in hashed:
            (Path(links) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(links) / name).symlink_to((folder / name).absolute())
        with _hub_errors(repo, revision):
            verdict = HfApi().verify_repo_checksums(repo, revision=revision, local_dir=links)
    for m in sorted(verdict.mismatches, key=lambda m: m["path"]):
        kind = HASH_NAMES.get(m["algorithm"], m["algorithm"])
        bad[m["path"]] = f"{kind} {m['actual'][:12]}... differs from the hub's {m['expected'][:12]}..."
    return dict(sorted(bad.items()))


def user_cache_snapshot(repo: str, revision: str) -> Path:
    """Where the user's own Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub) keeps `repo` at `revision`."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "snapshots" / revision


def copy_from_user_cache(storage: Path, repo: str, revision: str, listed: HubFiles) -> list[str]:
    """Copy into the partial snapshot under `storage` each `listed` file it lacks that the user's Hugging
    Face cache holds with the hub's size and hash; -> the names copied. A file that fails the check is
    named and left where it is (the user's cache is theirs): huggingface_hub downloads it instead."""
    theirs = user_cache_snapshot(repo, revision)
    ours = storage / "snapshots" / revision
    if not theirs.is_dir() or (ours.is_dir() and ours.resolve() == theirs.resolve()):
        return []
    wanted = {n: e for n, e in listed.items() if (theirs / n).is_file() and not held(storage, revision, n, e)}
    if not wanted:
        return []
    bad = problems(theirs, repo, revision, wanted)
    for name, why in bad.items():
        print(f"fetch: {name} in the Hugging Face cache {theirs.parents[2]} is not the hub's ({why}): downloading it")
    copied = sorted(set(wanted) - set(bad))
    for name in copied:
        target = ours / name
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(target.name + ".copying")  # a cut copy never poses as the file
        shutil.copyfile(theirs / name, scratch)
        os.replace(scratch, target)
    if copied:
        size = sum(listed_size(listed[n]) or 0 for n in copied)
        print(
            f"fetch: {len(copied)} of {len(listed)} files ({gb(size)}) copied from the Hugging Face cache "
            f"{theirs.parents[2]}, each checked against the hub's hash"
        )
    return copied


def forget(pointer: Path) -> None:
    """Delete a snapshot file and the cache blob it links to, so huggingface_hub downloads it again."""
    blob = pointer.resolve() if pointer.is_symlink() else None
    pointer.unlink(missing_ok=True)
    if blob is not None and blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)


def gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _stdout_tqdm():
    """huggingface_hub's progress bar class, drawing on stdout: stderr is kept for the one-line error."""
    from huggingface_hub.utils import tqdm

    class StdoutTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("file", sys.stdout)
            super().__init__(*args, **kwargs)

    return StdoutTqdm


def _hub_log_to_stdout() -> None:
    """huggingface_hub logs a retried transfer as warnings on stderr. They are progress, not errors, and
    would bury the stage's one-line error: they go to stdout (DVC shows both)."""
    from huggingface_hub.utils import logging as hub_logging

    for handler in hub_logging.get_logger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            handler.setStream(sys.stdout)


@contextmanager
def _hub_errors(repo: str, revision: str):
    """Turn huggingface_hub's and httpx's errors into one-line ClefErrors."""
    import httpx
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except RevisionNotFoundError:
        raise ClefError(f"revision {revision} not found in {repo}") from None
    except RepositoryNotFoundError:
        raise ClefError(
            f"repository {repo} not found on the hub, or private or gated without a token (HF_TOKEN)"
        ) from None
    except (HfHubHTTPError, LocalEntryNotFoundError, httpx.HTTPError, OSError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ClefError(f"download of {repo}@{revision} failed: {first}") from None


def fetch(model: dict[str, Any], cache: Path = Path("hf")) -> SnapshotRecord:
    """Build the snapshot for params `model` under `cache` atomically; -> its file record."""
    cache = Path(cache)
    partial = atomic.partial_dir(cache)
    if model["source"] in ("tiny", "synthetic"):
        if partial.exists():  # a generated snapshot is redone whole: start clean
            shutil.rmtree(partial)
        if model["source"] == "tiny":
            repo, revision = write_tiny(partial)
        else:
            repo, revision = write_synthetic(partial, model["synthetic_layers"])
    elif model["source"] == "hub":  # a kept partial directory lets an interrupted download resume
        repo, revision = download_hub(partial, model["repo"], model["revision"])
    else:
        raise ClefError(f"unknown model.source {model['source']!r}")
    fetched = snapshot_dir(partial, repo, revision)
    check_readable(fetched)  # refused before it replaces hf/
    rec = record(fetched, model["source"], repo, revision)
    for name in changed_in_place(snapshot_dir(cache, repo, revision), rec):
        print(f"fetch: {name} in {cache}/ differed from the snapshot fetched now (changed in place?): replaced")
    atomic.swap_in_dir(partial, cache)
    return dataclasses.replace(rec, path=os.path.relpath(snapshot_dir(cache, repo, revision)))


def changed_in_place(kept: Path, rec: SnapshotRecord) -> list[str]:
    """The files of `rec` that the snapshot directory `kept`, left by an earlier fetch of the same revision
    (hf/ persists across runs: dvc.yaml), holds with other bytes: an edit in place, which DVC noticed."""
    return [
        f.name
        for f in rec.files
        if (kept / f.name).is_file()
        and ((kept / f.name).stat().st_size != f.size or sha256_file(kept / f.name) != f.sha256)
    ]
