"""scripts/pipeline/profile.py: a stage's time by part, each part's seconds its own."""

import time

import pytest
import torch

from scripts.checks import layerwise
from scripts.pipeline import profile


@pytest.fixture(autouse=True)
def fresh():
    profile.reset()
    yield
    profile.reset()


def test_a_nested_part_counts_to_itself_only():
    """Guards against counting a nested part twice: the parts would then add up to more than the wall time
    (here 0.15 s of "conversion" would be 0.25 s)."""
    start = time.perf_counter()
    with profile.part("conversion"):
        time.sleep(0.1)
        with profile.part("hashing"):
            time.sleep(0.1)
        time.sleep(0.05)
    wall = time.perf_counter() - start
    got = profile.seconds()
    assert got["hashing"] == pytest.approx(0.1, abs=0.05)
    assert got["conversion"] == pytest.approx(0.15, abs=0.05)
    assert sum(got.values()) <= wall + 1e-3
    assert list(got) == [p for p in profile.PARTS if p in got]  # the table's order


def test_timing_keeps_what_it_times():
    """A timed LiteRT run is timing, not "LiteRT CPU runs": the latency measurement is one part."""
    with profile.part("timing"):
        with profile.part("LiteRT CPU runs"):
            time.sleep(0.05)
    assert set(profile.seconds()) == {"timing"}


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        with profile.part("float64 truths"):
            pass


def test_a_part_is_counted_when_its_block_raises():
    with pytest.raises(RuntimeError):
        with profile.part("torch"):
            time.sleep(0.02)
            raise RuntimeError("boom")
    assert profile.seconds()["torch"] >= 0.02


def test_a_float64_run_by_layer_counts_as_the_truth():
    """layerwise.cast_by_layer names its part by dtype: the profile's float64 truth is every exact run."""
    stack = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with layerwise.cast_by_layer(stack, list(stack), torch.float64):
        stack(torch.ones(1, 4, dtype=torch.float64))
    with layerwise.cast_by_layer(stack, list(stack), torch.float16):
        pass
    assert set(profile.seconds()) == {"float64 truth", "float16 floor"}
