"""Where a stage's time goes, by part: `with profile.part("float64 truth"): ...` around the work.

A part's seconds are its own: time inside a nested part counts to the inner one only, so the parts of
a stage add up to at most its wall time and the rest is `other` (imports, Python glue, writing
results). The harness (scripts/pipeline/harness.py) records the totals in results/runtime/<stage>.json
and scripts/bench/report.py extrapolates them like the stage's time. Nothing here changes a figure.
"""

from __future__ import annotations

import contextlib
import time

PARTS = (
    "load the stack",
    "conversion",
    "float64 truth",
    "float16 floor",
    "torch",
    "LiteRT CPU load",
    "LiteRT CPU runs",
    "GPU compile",
    "GPU runs",
    "timing",
    "hashing",
)
"""The parts a stage's time is cut into, in the order the profile table shows them."""
OTHER = "other"
WHOLE = ("timing",)
"""Parts that keep what runs inside them: a timed run is timing, whatever it runs."""

_seconds: dict[str, float] = {}
_open: list[list] = []  # [name, seconds own so far, started] of each part entered and not left, innermost last


@contextlib.contextmanager
def part(name: str):
    """Count the block's wall time, less its nested parts', to `name` (one of PARTS)."""
    if name not in PARTS:
        raise ValueError(f"profile part {name!r} is not one of {PARTS}")
    if _open and _open[-1][0] in WHOLE:
        yield
        return
    now = time.perf_counter()
    if _open:  # the enclosing part stops counting while this one runs
        outer = _open[-1]
        outer[1] += now - outer[2]
    _open.append([name, 0.0, now])
    try:
        yield
    finally:
        done = time.perf_counter()
        inner = _open.pop()
        _seconds[name] = _seconds.get(name, 0.0) + inner[1] + done - inner[2]
        if _open:
            _open[-1][2] = done


def seconds() -> dict[str, float]:
    """{part: seconds} of the parts this process has spent time in so far, in PARTS order."""
    return {name: round(_seconds[name], 3) for name in PARTS if name in _seconds}


def reset() -> None:
    """Forget the totals (a test; a process that profiles more than one run)."""
    _seconds.clear()
