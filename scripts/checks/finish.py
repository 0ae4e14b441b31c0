"""The one way a verify stage ends: its record written, its metrics row, its result in a line (or a
line per length), then the stage refused when the check found a problem.

In that order, so a check that fails still leaves its figures for `dvc metrics show` and for whoever
reads the record to see why; the refusal names the first problem and how many there were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from scripts.pipeline import atomic, metrics
from scripts.pipeline.errors import ClefError, first_of

if TYPE_CHECKING:  # a type only: the kernel and layer checks run no reference record
    from scripts.release.references import ReferenceFigures


@dataclass(frozen=True)
class GraphFindings:
    """What a verify stage found in one graph file before it is judged: the file's census and metadata
    (scripts/litert/tflite_file.py) and their problems, every check's row, and the reference record read
    back through the graph (scripts/release/references.py)."""

    path: Path
    form: str
    weights: str
    census: dict
    metadata: dict
    problems: list[str]
    rows: list[dict]
    reference: ReferenceFigures


@dataclass(frozen=True)
class CheckResult:
    """What a verify stage found, ready to be finished."""

    stage: str  # how the result names the check: "verify_tflite L=64"
    name: str  # its metrics row: results/metrics/<name>.json
    record: dict  # the detailed record
    record_path: Path  # where the record goes (layout.result_path(name); results/gpu/ for the GPU's)
    figures: dict  # the metrics row's figures (scripts/pipeline/metrics.py KEYS); `passed` is added
    lines: list[str]  # the result, one line each
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def finish(result: CheckResult) -> None:
    """Write the record and the metrics row, print the result, and fail the stage on a problem."""
    atomic.write_json(result.record_path, result.record)
    metrics.write(result.name, passed=result.passed, **result.figures)
    for line in result.lines:
        print(line, flush=True)
    if result.problems:
        raise ClefError(f"{result.stage} failed: {first_of(result.problems)}")
