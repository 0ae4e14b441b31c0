"""scripts/release/preflight.py: an overall check that did not pass is refused, naming it, before the
release builds anything."""

import json

import pytest

from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError
from scripts.release import preflight


def write_metrics(failed: set[str]) -> None:
    layout.METRICS.mkdir(parents=True)
    for name in preflight.OVERALL:
        doc = {"passed": name not in failed} if name != "kernel_bench" else {"ms": 1.0}  # a bench need not judge
        layout.metrics_path(name).write_text(json.dumps(doc))


def test_overall_reads_every_check_when_none_failed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_metrics(set())
    assert list(preflight.overall()) == list(preflight.OVERALL)


def test_a_failed_overall_check_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_metrics({"stack"})
    with pytest.raises(ClefError, match=r"a check did not pass: \['stack'\]"):
        preflight.overall()
