"""Third-party log lines kept out of a stage's output by default; `CLEF_DEBUG=1` keeps every one.

A stage prints one line per result and progress bars of its own. The libraries it runs add hundreds
of lines a run that say nothing about the result: LiteRT's C++ `INFO:` lines (an accelerator created
or destroyed, a delegate made), absl's and TensorFlow's glog-format INFO and WARNING lines (oneDNN's
notice, op counts), absl's note on its own log, Python warnings raised inside third-party code, and
litert-torch's conversion progress. `install()` drops exactly those:

- file descriptors 1 and 2 (where C++ writes, out of Python's reach; LiteRT logs on both) each go
  through a filter process that drops the lines matching NOISE and passes everything else on at once,
  progress redraws included. It is a child process, not a thread, so it outlives the stage: lines the
  runtime writes as the process tears down are filtered too, and nothing else written then is lost;
- a Python warning whose code lies outside this checkout is not shown (one raised in ours is);
- `mute_converter_progress()` silences litert-torch's console (scripts/litert/export.py calls it).

Errors are never dropped: an `E` glog line, an `ERROR:` line and a traceback pass through.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import warnings
from pathlib import Path

DEBUG_ENV = "CLEF_DEBUG"
CHECKOUT = Path(__file__).resolve().parents[2]

NOISE = re.compile(
    rb"INFO: "  # LiteRT's and TFLite's C++ INFO lines
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "  # absl/glog INFO, WARNING (seconds: a time, or the epoch)
)
"""The start of a line that is third-party noise (matched at the line's start)."""


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def install() -> None:
    """Filter this process's stdout and stderr and its Python warnings (nothing in debug mode)."""
    if debug():
        return
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        _filter_fd(fd, stream)
    _hide_third_party_warnings()


def mute_converter_progress() -> None:
    """litert-torch prints each conversion step (some 45 wrapped lines a graph) on its own console."""
    if debug():
        return
    from litert_torch import progress

    progress.console.quiet = True


def filtered(data: bytes, pending: bytes) -> tuple[bytes, bytes]:
    """(what to write now, what to hold) for `data` read after `pending`: whole lines (ended by \\n) that
    are NOISE are dropped; a progress redraw (ended by \\r) passes; an unfinished line is held only while
    it could still become noise (it starts with I or W), so a progress bar is drawn as it comes."""
    text, out = pending + data, bytearray()
    for piece in re.split(rb"(?<=[\r\n])", text):
        if not piece:
            continue
        if piece.endswith(b"\n"):
            if not NOISE.match(piece.lstrip(b"\r")):
                out += piece
        elif piece.endswith(b"\r") or piece.lstrip(b"\r")[:1] not in (b"I", b"W", b""):
            out += piece
        else:
            return bytes(out), piece
    return bytes(out), b""


def _filter_fd(fd: int, stream) -> None:
    """Replace `fd` by a pipe into a child process that writes what `filtered` keeps to the original."""
    stream.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter: reads until every writer (the stage and its children) has exited
        os.close(write_end)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the stage, which then says so here
        pending = b""
        while chunk := os.read(read_end, 1 << 16):
            out, pending = filtered(chunk, pending)
            if out:
                os.write(fd, out)
        if pending and not NOISE.match(pending.lstrip(b"\r")):
            os.write(fd, pending)
        os._exit(0)
    os.close(read_end)
    os.dup2(write_end, fd)
    os.close(write_end)


def _hide_third_party_warnings() -> None:
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        path = Path(filename)
        if path.is_absolute() and path.resolve().is_relative_to(CHECKOUT) and ".venv" not in path.parts:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
