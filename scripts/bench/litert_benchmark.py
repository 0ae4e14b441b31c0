"""LiteRT's own benchmark tool, `litert-benchmark` (installed with ai-edge-litert), on one signature of a
graph: warm-up runs, then timed runs, reported as percentiles with whether every op ran on the chosen
accelerator. The latency figures of the release's graphs come from it (stages/latency.py), not from a
loop of ours, so a device team reruns the very command on its own hardware and compares like with like.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record, optional

TOOL = "litert-benchmark"


@dataclasses.dataclass(frozen=True)
class SignatureTiming(Record):
    """One signature timed by the tool: whether every op ran on the accelerator, the threads, and the
    tool's own latency figures (FIGURES, in ms but for num_runs), named as its result names them."""

    signature: str
    fully_accelerated: bool | None
    num_threads: int
    median_ms: float
    p5_ms: float
    p95_ms: float
    avg_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    init_ms: float
    num_runs: int


FIGURES = tuple(f.name for f in dataclasses.fields(SignatureTiming))[3:]  # the tool's `latency` section


@dataclasses.dataclass(frozen=True)
class LatencyRow(SignatureTiming):
    """One row of results/latency.json: a signature's timing, and the graph it belongs to."""

    graph: str
    kind: str  # row or pair
    L: int | None = optional()
    P: int | None = optional()
    S: int | None = optional()

    @classmethod
    def of(cls, timing: SignatureTiming, graph: str, kind: str, **shape: int) -> LatencyRow:
        """`timing` as the row of graph `graph` of `kind`, whose `shape` is its L, or its P and S."""
        return cls(**dataclasses.asdict(timing), graph=graph, kind=kind, **shape)


@dataclasses.dataclass(frozen=True)
class LatencyReport(Record):
    """results/latency.json, the latency stage's record: how the tool ran, and every signature's row."""

    tool: str
    ai_edge_litert: str | None
    accelerator: str
    runs: int
    warmup_runs: int
    threads: int
    rows: list[LatencyRow]


def tool() -> str:
    """The tool beside this Python (the venv's bin/), else on PATH; one line when neither has it."""
    beside = Path(sys.executable).parent / TOOL
    found = str(beside) if os.access(beside, os.X_OK) else shutil.which(TOOL)
    if found is None:
        raise ClefError(f"no {TOOL} beside {sys.executable} or on PATH: it comes with ai-edge-litert (make env)")
    return found


def command(path: Path, signature: str, runs: int, warmup: int, threads: int, result: Path) -> list[str]:
    """The command line, as the README shows it for a device team to rerun."""
    return [
        tool(),
        "--model", str(path),
        "--signature", signature,
        "--num_runs", str(runs),
        "--warmup_runs", str(warmup),
        "--num_threads", str(threads),
        "--result_json", str(result),
    ]  # fmt: skip


def reason(output: str) -> str:
    """The tool's own account of a failure: its last ERROR line, else its last line that is not LiteRT's
    INFO noise (scripts/pipeline/quiet.py)."""
    from scripts.pipeline.quiet import NOISE

    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if " ERROR " in line or line.startswith("ERROR")]
    said = errors or [line for line in lines if not NOISE.match(line.encode())]
    return said[-1] if said else "no output"


def run(path: Path, signature: str, runs: int, warmup: int, threads: int) -> SignatureTiming:
    """One signature of the graph at `path` on the CPU accelerator, timed. A failed run is one line
    naming the graph, with the tool's reason."""
    with tempfile.TemporaryDirectory(prefix="clef-benchmark-") as tmp:
        result = Path(tmp) / "result.json"
        done = subprocess.run(
            command(path, signature, runs, warmup, threads, result), capture_output=True, text=True, check=False
        )
        if done.returncode != 0 or not result.is_file():
            said = reason(done.stdout + "\n" + done.stderr)
            raise ClefError(f"{TOOL} on {path} signature {signature} failed (exit {done.returncode}): {said}")
        doc = json.loads(result.read_text())
    latency = doc.get("latency") or {}
    missing = [k for k in FIGURES if k not in latency]
    if missing:
        raise ClefError(f"{TOOL} on {path}: its result lacks {missing}; this version reports {sorted(latency)}")
    return SignatureTiming(
        signature=doc.get("signature", signature),
        fully_accelerated=doc.get("fully_accelerated"),
        num_threads=doc.get("num_threads", threads),
        **{k: latency[k] for k in FIGURES},
    )
