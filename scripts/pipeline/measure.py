"""Process measurements recorded by the stages: peak resident memory and wall time.

Every stage run through `harness.run_stage` also leaves results/runtime/<stage>.json: its wall time
from process start (imports included: they are part of what a stage costs), its peak RSS, and its
peak anonymous memory. These are benchmark records for results/bench.json, not DVC outputs: a stage
DVC skips keeps its last run's record.

Peak RSS counts every resident page, including the pages of a file mapped read-only (a graph the
interpreter maps, a checkpoint shard), which the kernel can drop and read again when memory runs
short; peak anonymous memory is what the machine must really provide: RssAnon + RssShmem, the
swap-backed pages (shared memory and memfd mappings count: that is where lavapipe, the software
Vulkan driver, keeps the GPU's "device" memory). It is sampled by a separate process, because a
C++ call that holds the GIL (LiteRT compiling a graph) would stop a sampling thread for its length.

The memory budget (params.yaml `memory`): a stage's peak anonymous memory must stay within
factor x the fp32 stack's bytes (results/stack.json, written by the `stack` stage; 0 before it
exists) + overhead_gib, or the stage fails after recording what it used.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import sys
import time
from pathlib import Path

from scripts.pipeline.records import Record, optional


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far: VmHWM, the high-water mark of its own memory.
    Not ru_maxrss, which Linux carries across exec from the process that started it: a stage run by
    a large parent (a test session holding models) would report the parent's peak as its own."""
    return memory_status().peak


@dataclasses.dataclass(frozen=True)
class MemoryStatus:
    """A process's resident memory from /proc/<pid>/status, in bytes: rss (VmRSS), peak (VmHWM, its
    high-water mark), anon (RssAnon + RssShmem: heap, anonymous and shared mappings, what cannot be
    dropped) and file (RssFile: mapped files' pages). A process that has exited but is not yet reaped
    (a zombie) has no memory lines: each is then None."""

    peak: int | None = None
    rss: int | None = None
    anon: int | None = None
    file: int | None = None


def memory_status(pid: str = "self") -> MemoryStatus:
    """The memory of process `pid` now (MemoryStatus)."""
    fields = {"VmHWM": "peak", "VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            out[fields[key]] = int(re.match(r"\s*(\d+)", rest).group(1)) * 1024
    shmem = out.pop("shmem", 0)
    if "anon" in out:
        out["anon"] += shmem
    return MemoryStatus(**out)


# The sampler process: the peak of the watched process's anonymous memory every `interval` seconds,
# printed when a line (or end of file) arrives on stdin, or when the process is gone (or a zombie).
# The figure goes out with one os.write: a watched process that died without stopping the sampler
# has closed the pipe, and then there is no one to tell (no traceback on the stage's stderr).
_SAMPLER = """
import os, select, sys
from scripts.pipeline.measure import memory_status
pid, interval, peak = sys.argv[1], float(sys.argv[2]), 0
while True:
    try:
        anon = memory_status(pid).anon
    except (FileNotFoundError, ProcessLookupError):
        anon = None
    if anon is None:
        break
    peak = max(peak, anon)
    if select.select([sys.stdin], [], [], interval)[0]:
        break
try:
    os.write(1, f"{peak}\\n".encode())
except OSError:
    pass
"""


class AnonPeak:
    """Peak anonymous memory of this process (memory_status "anon"), sampled every `interval` seconds
    from start() by a separate process (a peak shorter than the interval can be missed: the figure
    is a lower bound, close for the stages' allocations, which live for seconds). As a context, the
    sampler is stopped on the way out whatever happened inside."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak = interval, 0
        self._process = None

    def start(self) -> AnonPeak:
        import os
        import subprocess

        root = str(Path(__file__).resolve().parents[2])
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, str(os.getpid()), str(self.interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        return self

    def stop(self) -> int:
        """Stop sampling (one last sample here too) -> the peak in bytes."""
        out, _ = self._process.communicate("stop\n", timeout=60)
        self.peak = max(int(out.strip() or 0), memory_status().anon)
        return self.peak

    def __enter__(self) -> AnonPeak:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self._process.poll() is None:
            self._process.communicate("stop\n", timeout=60)


MIN_REPEATS = 3  # the fewest timed calls a median is taken over


def timed_runs(fn, repeats: int, budget_seconds: float | None = None) -> list[float]:
    """Wall seconds of each of up to `repeats` calls of fn(), after one warm-up call (first-call
    allocation and weight packing are not the steady state); with `budget_seconds`, the calls stop
    once MIN_REPEATS (or `repeats`, if fewer) have run and together took that long."""
    from scripts.pipeline import profile

    with profile.part("timing"):
        fn()
        times = []
        while len(times) < repeats:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
            if budget_seconds is not None and len(times) >= MIN_REPEATS and sum(times) >= budget_seconds:
                break
    return times


def median_seconds(fn, repeats: int, budget_seconds: float | None = None) -> float:
    """The median of timed_runs."""
    return statistics.median(timed_runs(fn, repeats, budget_seconds))


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


def stack_fp32_bytes(root: str = ".") -> int | None:
    """The fp32 stack's bytes (results/stack.json, written by the `stack` stage), None before it exists."""
    from scripts.pipeline import layout

    stack = Path(root) / layout.result_path("stack")
    return json.loads(stack.read_text())["fp32_bytes"] if stack.is_file() else None


@dataclasses.dataclass(frozen=True)
class MemoryBudget(Record):
    """A stage's memory budget (params.yaml `memory`) as it applied to one run."""

    factor: float
    overhead_gib: float
    fp32_stack_bytes: int | None  # results/stack.json's, None before the stack stage ran
    limit_bytes: int
    within: bool


@dataclasses.dataclass(frozen=True)
class Runtime(Record):
    """results/runtime/<stage>.json: what one run of a stage cost."""

    stage: str
    argv: list[str]
    seconds: float
    peak_rss_bytes: int
    finished_utc: str
    peak_anon_bytes: int | None = optional()  # absent from records made before it was sampled
    startup_seconds: float | None = optional()  # process start to main(), when the harness measured it
    memory_budget: MemoryBudget | None = optional()  # absent for a benchmark, run without a budget
    parts: dict[str, float] | None = optional()  # seconds by part (scripts/pipeline/profile.py); absent before it


def memory_budget(anon_peak_bytes: int, root: str = ".") -> MemoryBudget:
    """The stage's peak anonymous memory against params.yaml `memory` and the stack's fp32 bytes."""
    from scripts.pipeline import bounds, params

    budget = params.bound_section("memory", Path(root) / "params.yaml")
    fp32 = stack_fp32_bytes(root)
    limit = bounds.memory_limit(budget, fp32)
    return MemoryBudget(budget["factor"], budget["overhead_gib"], fp32, limit, anon_peak_bytes <= limit)


def over_budget(run: Runtime) -> str | None:
    """One line when a run's peak anonymous memory is over its budget, else None."""
    b = run.memory_budget
    if b is None or b.within:
        return None
    stack = f"{b.fp32_stack_bytes / 2**30:.2f} GiB" if b.fp32_stack_bytes is not None else "none yet"
    peak, limit = distinct_gib(run.peak_anon_bytes, b.limit_bytes)
    return (
        f"{run.stage}: peak anonymous memory {peak} GiB is over its budget {limit} GiB (params.yaml memory: "
        f"{b.factor} x the fp32 stack ({stack}) + {b.overhead_gib} GiB; raise memory.overhead_gib or "
        "memory.factor if this machine needs more)"
    )


def distinct_gib(a: int, b: int) -> tuple[str, str]:
    """Byte counts a != b in GiB, with the fewest decimals (2 at least) that tell them apart: a peak over a
    budget never reads as equal to it ("0.01 GiB is over its budget 0.01 GiB")."""
    for decimals in range(2, 10):
        shown = f"{a / 2**30:.{decimals}f}", f"{b / 2**30:.{decimals}f}"
        if shown[0] != shown[1]:
            return shown
    return shown


def record_runtime(
    anon_peak_bytes: int, root: str = ".", budget: bool = True, startup_seconds: float | None = None
) -> Runtime:
    """Write results/runtime/<stage>.json for the stage this process ran (with its memory budget
    when `budget`, and the seconds it took to start: process start to its main(), imports included,
    when given); -> the record."""
    from scripts.pipeline import atomic, layout, profile

    run = Runtime(
        stage=stage_name(),
        argv=sys.argv[1:],
        seconds=process_seconds(),
        peak_rss_bytes=peak_rss_bytes(),
        peak_anon_bytes=anon_peak_bytes,
        finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        startup_seconds=startup_seconds,
        memory_budget=memory_budget(anon_peak_bytes, root) if budget else None,
        parts=profile.seconds(),
    )
    atomic.write_json(layout.runtime_path(run.stage, root), run.to_json())
    return run
