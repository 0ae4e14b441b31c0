"""scripts/bench/conversion_bench.py: the records export_stock and export_bench write and read."""

import json

import pytest

from scripts.bench import conversion_bench
from scripts.pipeline.errors import ClefError

# results/export_stock.json's keys, less the checkpoint's revision, in the order the stages write them
KEYS = [
    "form",
    "L",
    "layers",
    "convert_seconds",
    "op_total",
    "ops_per_gdn_layer_max",
    "ops_per_gdn_layer_min",
    "violations",
    "torch_median_s",
    "litert_median_s",
]


def bench() -> conversion_bench.ConversionBench:
    return conversion_bench.ConversionBench(
        form="loop",
        L=64,
        layers=4,
        convert_seconds=70.0,
        op_total=3006,
        ops_per_gdn_layer_max=925,
        ops_per_gdn_layer_min=922,
        violations=["op CUMSUM x3"],
        torch_median_s=0.01,
        litert_median_s=0.008,
    )


def test_the_record_keeps_the_written_keys_and_reads_back():
    doc = {"revision": "abc", **bench().to_json()}
    assert list(doc) == ["revision", *KEYS]
    assert conversion_bench.ConversionBench.from_json(json.loads(json.dumps(doc)), "export_stock.json") == bench()


def test_a_record_without_a_figure_is_one_line_naming_the_file():
    doc = bench().to_json()
    del doc["litert_median_s"]
    with pytest.raises(ClefError, match="export_stock.json: no `litert_median_s`"):
        conversion_bench.ConversionBench.from_json(doc, "export_stock.json")


def test_the_first_steps_figures_carry_the_vocabulary_the_record_leaves_out():
    fields = [f.name for f in conversion_bench.dataclasses.fields(conversion_bench.Converted)]
    assert fields == [*KEYS[:-1], "vocab"]
