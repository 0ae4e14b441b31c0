"""One timed conversion of the L=64 row graph of the model's first block (its GatedDeltaNets up to and
including the first attention layer: clef-flash's 3 + 1, the unit its 32 layers repeat) under a kernel
form: conversion time, op counts, and the latency of torch and of the interpreter on the same record.
The ratios stock / form are per layer, so one block shows them at an eighth of clef-flash's cost.
The export_stock and export_bench stages each run it once, so the stock `loop` kernel's slow
conversion (results/export_stock.json's convert_seconds) is redone only when the checkpoint changes,
not the form.

Two steps, so that the caller frees the stack in between (the weights are never in memory twice):
`convert_timed` with the model, then `litert_timed` with the file alone."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from scripts.checks import record_text, tflite_check
from scripts.litert import export, tflite_file
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.measure import Stopwatch
from scripts.pipeline.records import Record
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host

BENCH_L = 64
REPEATS = 5


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A conversion under a form timed (convert_timed): its op counts and torch's latency on the record."""

    form: str
    L: int
    layers: int
    convert_seconds: float
    op_total: int
    ops_per_gdn_layer_max: int
    ops_per_gdn_layer_min: int
    violations: list[str]
    torch_median_s: float


@dataclasses.dataclass(frozen=True)
class Converted(Conversion):
    """The first step's figures, with the vocabulary the second step draws the interpreter's record from."""

    vocab: int


@dataclasses.dataclass(frozen=True)
class ConversionBench(Conversion, Record):
    """One timed conversion as export_stock and export_bench write it: the conversion's figures and the
    interpreter's median latency on the same record."""

    litert_median_s: float


def bench_record(host: Host, vocab: int) -> Tensors:
    """The row graph inputs both conversions are timed on: BENCH_L random tokens, the same for every form."""
    return host.record(record_text.random_ids(BENCH_L, vocab, BENCH_L), BENCH_L)


def load_block(snap: Path, form: str):
    """The first block of the stack (patched, `form` applied): what both conversions are timed on."""
    model, _, _ = patch.load(snap, form, progress=False, block=True)
    return model


def convert_timed(model, form: str, host: Host, path: Path, repeats: int = REPEATS) -> Converted:
    """`model` (load_block) as the L=64 row graph converted to `path`, timed; its op counts and torch's
    median latency on the bench record."""
    graph = row_graph.ClefRowPrefill(model, BENCH_L)
    inputs = bench_record(host, model.config.vocab_size)
    clock = Stopwatch()
    export.convert(graph, inputs, path)
    seconds = clock.seconds()
    census = tflite_file.census(path)
    per_layer = list(census["ops_per_gdn_layer"].values())
    return Converted(
        form=form,
        L=BENCH_L,
        layers=len(model.layers),
        convert_seconds=seconds,
        op_total=census["op_total"],
        ops_per_gdn_layer_max=max(per_layer),
        ops_per_gdn_layer_min=min(per_layer),
        violations=tflite_file.violations(census),
        torch_median_s=statistics.median(tflite_check.torch_times(graph, inputs, repeats)),
        vocab=model.config.vocab_size,
    )


def litert_timed(converted: Converted, path: Path, host: Host, repeats: int = REPEATS) -> ConversionBench:
    """`converted` (convert_timed) with the interpreter's median latency on the same record added."""
    runner = tflite_check.interpreter(path).get_signature_runner()
    runs = tflite_check.litert_times(runner, bench_record(host, converted.vocab), repeats)
    figures = {f.name: getattr(converted, f.name) for f in dataclasses.fields(Conversion)}
    return ConversionBench(**figures, litert_median_s=statistics.median(runs))
