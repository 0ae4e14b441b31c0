"""One error type for bad input, and the wrapper that turns it into one line and a non-zero exit.

Anything else that escapes a stage is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

EXIT_BAD_INPUT = 2


class ClefError(Exception):
    """Bad input or a broken contract, reported as one line naming the problem."""


def run_command(main: Callable[[], None]) -> None:
    """Run a command's main(); a ClefError becomes `error: <message>` on stderr and exit status 2."""
    try:
        main()
    except ClefError as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message was built from
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)


def run_stage(main: Callable[[], None], budget: bool = True) -> None:
    """run_command for a DVC stage: one that finishes also leaves its time, peak RSS and peak anonymous
    memory in results/runtime/ (scripts/pipeline/measure.py), and fails when that memory is over the
    budget (params.yaml `memory`). `budget=False`: a benchmark script, neither recorded (it is not
    a pipeline stage) nor held to the budget."""

    def measured() -> None:
        from scripts.pipeline.measure import AnonPeak, over_budget, process_seconds, record_runtime

        startup = process_seconds()  # the stage's imports: the same at any depth (bench extrapolation)
        with AnonPeak() as sampler:
            main()
            peak = sampler.stop()
        problem = over_budget(record_runtime(peak, budget=budget, startup_seconds=startup)) if budget else None
        if problem:
            raise ClefError(problem)

    run_command(measured)
