"""One timed conversion of the L=64 row graph under a kernel form: conversion time, op counts and
interpreter latency. The export_stock and export_bench stages each run it once, so the stock `loop`
kernel's slow conversion (results/export_stock.json's convert_seconds) is redone only when the checkpoint
changes, not the form."""

from __future__ import annotations

import tempfile
from pathlib import Path

from scripts.checks import model_check, tflite_check
from scripts.litert import export, tflite_file
from scripts.pipeline.measure import Stopwatch
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host

BENCH_L = 64


def convert_timed(snap: Path, form: str, host: Host, repeats: int = 5) -> dict:
    model, _, _ = patch.load(snap, form, progress=False)
    graph = row_graph.ClefRowPrefill(model, BENCH_L)
    inputs = host.record(model_check.random_ids(BENCH_L, model.config.vocab_size, BENCH_L), BENCH_L)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.tflite"
        clock = Stopwatch()
        export.convert(graph, inputs, path)
        seconds = clock.seconds()
        census = tflite_file.census(path)
        runner = tflite_check.interpreter(path).get_signature_runner()
        timing = tflite_check.latency(runner, graph, inputs, repeats=repeats)
    per_layer = list(census["ops_per_gdn_layer"].values())
    return {
        "form": form,
        "L": BENCH_L,
        "convert_seconds": seconds,
        "op_total": census["op_total"],
        "ops_per_gdn_layer_max": max(per_layer),
        "ops_per_gdn_layer_min": min(per_layer),
        "violations": tflite_file.violations(census),
        "litert_median_s": timing["litert_median_s"],
        "torch_median_s": timing["torch_median_s"],
    }
