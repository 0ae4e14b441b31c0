"""scripts/bench/litert_benchmark.py: LiteRT's own benchmark tool run on a graph, its percentiles read,
and each way it can fail said in one line."""

from __future__ import annotations

import sys

import pytest

from scripts.bench import litert_benchmark
from scripts.litert import precision_probe
from scripts.pipeline.errors import ClefError


@pytest.fixture(scope="module")
def graph():
    return precision_probe.graph_path()  # a small graph with one signature, `probe`


def test_a_run_gives_percentiles_in_order(graph):
    r = litert_benchmark.run(graph, "probe", runs=5, warmup=1, threads=1)
    assert r.signature == "probe" and r.num_runs == 5 and r.num_threads == 1 and r.fully_accelerated
    assert 0 < r.min_ms <= r.p5_ms <= r.median_ms <= r.p95_ms <= r.max_ms
    # results/latency.json's row keys, as the tool's result names its figures
    figures = ["median_ms", "p5_ms", "p95_ms", "avg_ms", "std_ms", "min_ms", "max_ms", "init_ms", "num_runs"]
    assert list(r.to_json()) == ["signature", "fully_accelerated", "num_threads", *figures]
    assert type(r).from_json(r.to_json(), "latency.json") == r
    row = litert_benchmark.LatencyRow.of(r, "row_L64", "row", L=64)
    assert row.to_json() == {**r.to_json(), "graph": "row_L64", "kind": "row", "L": 64}


def test_a_signature_the_graph_lacks_is_one_line_with_the_tools_reason(graph):
    with pytest.raises(ClefError) as e:
        litert_benchmark.run(graph, "serving_default", runs=2, warmup=1, threads=1)
    line = str(e.value)
    assert "\n" not in line and str(graph) in line and 'Signature "serving_default" not found' in line


def test_no_tool_is_one_line_naming_where_it_comes_from(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClefError, match="no litert-benchmark .* it comes with ai-edge-litert"):
        litert_benchmark.tool()
