"""One error type for bad input, and the wrapper that turns it into one line and a non-zero exit.

Anything else that escapes a stage is a bug and keeps its traceback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

EXIT_BAD_INPUT = 2


class ClefError(Exception):
    """Bad input or a broken contract, reported as one line naming the problem."""


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
_interrupted = False


def _on_interrupt(signum, frame) -> None:
    """SIGINT: remembered, then raised. Remembered because a KeyboardInterrupt raised inside a garbage
    collection callback (XLA's, during a conversion) is printed and dropped, and the work carried on."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C came, even one that was swallowed: called before an output is
    put in place (scripts/pipeline/atomic.py), so nothing is written after it."""
    if _interrupted:
        raise KeyboardInterrupt


def run_command(main: Callable[[], None]) -> None:
    """Run a command's main(); a ClefError becomes `error: <message>` on stderr and exit status 2, a
    permission refused by the system one line naming the path (exit 2), Ctrl-C one line and exit 130,
    also when it was swallowed on the way."""
    previous = signal.signal(signal.SIGINT, _on_interrupt)
    try:
        main()
        check_interrupted()
    except ClefError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except PermissionError as exc:
        _fail(f"permission denied: cannot write or read {exc.filename or 'a file'} ({exc.strerror})", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        _fail("interrupted (Ctrl-C): stopped, no output written after it", EXIT_INTERRUPTED)
    finally:
        signal.signal(signal.SIGINT, previous)


def _fail(message: str, status: int) -> None:
    message = " ".join(message.split())  # one line, whatever the message was built from
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


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
