"""The harness every DVC stage runs in: its output quiet, a ClefError one line and exit 2, and, once it
finishes, its time and peak memory recorded in results/runtime/ and held to the memory budget.

The harness writes no DVC output and changes no figure a stage computes, so it is not a stage's code
dependency (scripts/pipeline/stage_deps.py does not follow it): editing the memory sampler or the log
filter reruns nothing. A module a stage's own code imports (measure.timed_runs for latency, say) is
followed there as any other.
"""

from __future__ import annotations

from collections.abc import Callable

from scripts.pipeline.errors import ClefError, run_command


def run_stage(main: Callable[[], None], budget: bool = True) -> None:
    """run_command for a DVC stage, quiet (scripts/pipeline/quiet.py): one that finishes also leaves its
    time, peak RSS and peak anonymous memory in results/runtime/ (scripts/pipeline/measure.py), and fails
    when that memory is over the budget (params.yaml `memory`). `budget=False`: a benchmark script,
    neither recorded (it is not a pipeline stage) nor held to the budget."""

    from scripts.pipeline import quiet

    quiet.install()  # third-party log noise off this process's output (CLEF_DEBUG=1 keeps it)

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
