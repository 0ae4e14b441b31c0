"""The per-pair stages' command line (scripts/pipeline/cli.py): both numbers required, as integers."""

from __future__ import annotations

import pytest

from scripts.pipeline import cli


def test_pair_arguments_take_the_prefix_and_the_suffix():
    a = cli.pair_arguments(["--prefix", "256", "--suffix", "64"])
    assert (a.prefix, a.suffix) == (256, 64)


@pytest.mark.parametrize("argv", [["--prefix", "256"], ["--suffix", "64"], ["--prefix", "x", "--suffix", "64"]])
def test_a_missing_or_non_integer_side_is_refused(argv):
    with pytest.raises(SystemExit):
        cli.pair_arguments(argv)
