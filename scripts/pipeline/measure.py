"""Process measurements recorded by the stages: peak resident memory and wall time.

Every stage run through `errors.run_stage` also leaves results/runtime/<stage>.json: its wall time
from process start (imports included: they are part of what a stage costs) and its peak RSS. These
are benchmark records for results/bench.json, not DVC outputs: a stage DVC skips keeps its last
run's record.
"""

from __future__ import annotations

import resource
import sys
import time


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return round(time.perf_counter() - self.start, 3)


def process_seconds() -> float:
    """Wall time since this process started."""
    import psutil

    return round(time.time() - psutil.Process().create_time(), 3)


def stage_name(argv: list[str] | None = None) -> str:
    """`python -m stages.export --length 64` -> "export@64" (DVC's own name for a foreach stage)."""
    argv = sys.argv if argv is None else argv
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = spec.name.rsplit(".", 1)[-1] if spec else argv[0].rsplit("/", 1)[-1].removesuffix(".py")
    values = [a for a in argv[1:] if not a.startswith("-")]
    return f"{module}@{'_'.join(values)}" if values else module


def record_runtime(root: str = ".") -> dict:
    """Write results/runtime/<stage>.json for the stage this process ran; -> the record."""
    from scripts.pipeline import atomic, layout

    rec = {
        "stage": stage_name(),
        "argv": sys.argv[1:],
        "seconds": process_seconds(),
        "peak_rss_bytes": peak_rss_bytes(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic.write_json(layout.runtime_path(rec["stage"], root), rec)
    return rec
