"""scripts/pipeline/progress.py: a stage's phases counted on a bar whose total was declared."""

from __future__ import annotations

import pytest

from scripts.pipeline.progress import Phases


def test_each_phase_is_named_and_counted(capsys):
    with Phases("verify_tflite L=64", ["load", "run", "write"]) as phase:
        phase("load")
        phase("run")
        assert "1/3 phases" in capsys.readouterr().err.replace("\r", "\n").splitlines()[-1]
        phase("write")
    err = capsys.readouterr().err
    assert "verify_tflite L=64: 3/3 phases" in err and "write" in err


def test_a_phase_not_declared_is_a_bug_of_the_stage():
    with pytest.raises(ValueError, match="'pack' is not one of the declared"), Phases("x", ["load"]) as phase:
        phase("pack")


def test_a_failing_phase_is_not_counted_done(capsys):
    with pytest.raises(RuntimeError), Phases("x", ["load", "run"]) as phase:
        phase("load")
        phase("run")
        raise RuntimeError("boom")
    assert "2/2" not in capsys.readouterr().err
