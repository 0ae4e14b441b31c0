"""Atomic outputs: a stage killed midway leaves nothing that DVC could take for a finished output.

Files are written beside their target and renamed over it (rename is atomic on one filesystem);
directories are built under a `.partial` name and swapped in whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from scripts.pipeline.errors import ClefError, check_interrupted


def ordinary_mode() -> int:
    """The mode open() gives a new file: 0666 less the umask (0644 under the usual 022). mkstemp's 0600
    would leave every output unreadable to the rest of a team on a shared machine; no output is a secret
    (private keys are written by scripts/release/signing.py, 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """Open a temporary file beside `path` for binary writing; it replaces `path` only when the block
    ends without an exception (flushed and fsynced first), and is removed otherwise."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        os.fchmod(fd, ordinary_mode())
    except PermissionError:
        raise ClefError(f"cannot write {path}: permission denied in {path.parent}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        check_interrupted()  # a Ctrl-C that was swallowed on the way: the old output stays
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def scratch_file(beside: str | os.PathLike, suffix: str):
    """A path for an intermediate file next to `beside` (same filesystem: a multi-GB graph is not
    copied across devices), removed when the block ends, whatever happens."""
    beside = Path(beside)
    beside.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=beside.parent, prefix=f".{beside.name}.", suffix=suffix)
    os.fchmod(fd, ordinary_mode())  # a scratch graph is renamed into place: it keeps this mode
    os.close(fd)
    try:
        yield Path(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with writing(path) as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def dumps_json(obj) -> str:
    """The one JSON style of every file we write: sorted keys, 1-space indent, trailing newline."""
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def write_json(path: str | os.PathLike, obj) -> None:
    write_text(path, dumps_json(obj))


def partial_dir(final: str | os.PathLike) -> Path:
    """The fixed build location of directory `final` (fixed, so an interrupted download can resume)."""
    final = Path(final)
    return final.with_name(final.name + ".partial")


def swap_in_dir(built: str | os.PathLike, final: str | os.PathLike) -> None:
    """Replace directory `final` by the finished directory `built` (two renames, no copy)."""
    swap_in_dirs([(built, final)])


def swap_in_dirs(pairs: list[tuple[str | os.PathLike, str | os.PathLike]]) -> None:
    """Replace each directory `final` by its finished `built`, all of them or none: the old ones are
    renamed aside first, and every rename is undone if one fails (renames only, no copies)."""
    pairs = [(Path(built), Path(final)) for built, final in pairs]
    check_interrupted()  # a Ctrl-C that was swallowed on the way: the old directories stay
    aside, placed = [], []
    try:
        for _, final in pairs:
            old = final.with_name(final.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            if final.exists() or final.is_symlink():
                os.replace(final, old)
                aside.append((old, final))
        for built, final in pairs:
            os.replace(built, final)
            placed.append((built, final))
    except BaseException:
        for built, final in reversed(placed):
            os.replace(final, built)
        for old, final in reversed(aside):
            os.replace(old, final)
        raise
    for old, _ in aside:
        shutil.rmtree(old)
