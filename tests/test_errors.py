"""scripts/pipeline/errors.py and atomic.py: what reaches a stage's user when the system, not the input,
stops it. A permission refused and a Ctrl-C are one line and a non-zero exit, and no output is written
after them, also when the interrupt was swallowed on the way (as a KeyboardInterrupt raised in a garbage
collection callback is, during a conversion)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from scripts.pipeline import atomic, errors
from tests.conftest import ROOT


def stage(tmp_path, body: str) -> subprocess.CompletedProcess:
    """`body` (the stage's main, with `out` its output path) run as a stage is run: errors.run_command."""
    script = tmp_path / "stage.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, time
            from pathlib import Path
            from scripts.pipeline import atomic, errors
            out = Path({str(tmp_path / "out.txt")!r})

            def main():
            """
        )
        + textwrap.indent(textwrap.dedent(body), "    ")
        + "\nerrors.run_command(main)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's scripts, as `python -m stages.X` finds them
    return subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


# A stage body that sends itself Ctrl-C and swallows the KeyboardInterrupt, as a gc callback does.
SWALLOWED_CTRL_C = """
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    pass
"""


def test_a_swallowed_ctrl_c_still_stops_the_stage_before_it_writes(tmp_path):
    """Broken once: the conversion went on after `Exception ignored in: <function _xla_gc_callback>`, DVC
    recorded the outputs and exited 0. Here the interrupt is swallowed the same way, then the stage tries
    to write: nothing is written, one line, exit 130."""
    (tmp_path / "out.txt").write_text("the last good run's\n")
    proc = stage(tmp_path, SWALLOWED_CTRL_C + 'atomic.write_text(out, "written after Ctrl-C\\n")\n')
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == errors.EXIT_INTERRUPTED and said == [
        "error: interrupted (Ctrl-C): stopped, no output written after it"
    ], proc.stderr
    assert (tmp_path / "out.txt").read_text() == "the last good run's\n"
    assert not list(tmp_path.glob(".out.txt.*"))  # no temporary left


def test_a_swallowed_ctrl_c_fails_the_stage_even_with_nothing_left_to_write(tmp_path):
    proc = stage(tmp_path, SWALLOWED_CTRL_C)
    assert proc.returncode == errors.EXIT_INTERRUPTED and proc.stderr.startswith("error: interrupted"), proc.stderr


def test_a_stage_that_is_not_interrupted_writes_and_exits_0(tmp_path):
    proc = stage(tmp_path, 'atomic.write_text(out, "done\\n")\n')
    assert proc.returncode == 0 and proc.stderr == "" and (tmp_path / "out.txt").read_text() == "done\n"


def test_a_directory_it_may_not_write_is_one_line_naming_the_output(tmp_path, monkeypatch, capsys):
    """As root a read-only directory is writable, so the refusal is the system's own PermissionError, raised
    where atomic.writing makes its temporary. Broken once: a traceback ending in the temporary's name."""

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "results" / ".params.txt.x.partial"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", refused)
    with pytest.raises(SystemExit) as exit_:
        errors.run_command(lambda: atomic.write_text(tmp_path / "results" / "params.txt", "x"))
    said = capsys.readouterr().err.splitlines()
    assert exit_.value.code == errors.EXIT_BAD_INPUT and said == [
        f"error: cannot write {tmp_path / 'results' / 'params.txt'}: permission denied in {tmp_path / 'results'}"
    ]


def test_any_other_permission_refusal_is_one_line_naming_the_path(capsys):
    def main():
        raise PermissionError(13, "Permission denied", "/root/secret")

    with pytest.raises(SystemExit) as exit_:
        errors.run_command(main)
    assert exit_.value.code == errors.EXIT_BAD_INPUT
    said = capsys.readouterr().err
    assert said == "error: permission denied: cannot write or read /root/secret (Permission denied)\n"


def test_first_of_names_the_first_problem_and_counts_the_rest():
    assert errors.first_of(["a is bad"]) == "a is bad"
    assert errors.first_of(["a is bad", "b is bad", "c is bad"]) == "a is bad (and 2 more)"
