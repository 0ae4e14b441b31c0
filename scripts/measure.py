"""Process measurements recorded by the stages: peak resident memory and wall time."""
from __future__ import annotations

import resource
import time


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return round(time.perf_counter() - self.start, 3)
