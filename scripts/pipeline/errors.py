"""One error type for bad input, and the wrapper that turns it into one line and a non-zero exit.

Anything else that escapes a command is a bug and keeps its traceback. Imports nothing of ours: every
module may raise ClefError, so this one depends on none of them (a stage's harness is
scripts/pipeline/harness.py).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence

EXIT_BAD_INPUT = 2


class ClefError(Exception):
    """Bad input or a broken contract, reported as one line naming the problem."""


def first_of(problems: Sequence[str]) -> str:
    """The first of several problems as one line, with how many more there are: `x (and 2 more)`."""
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


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
