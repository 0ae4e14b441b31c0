"""Run a row graph `.tflite` in the LiteRT interpreter against the torch row graph: accuracy at the
real positions, and latency as a ratio measured in the same run (medians, torch then LiteRT)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from scripts.checks import records
from scripts.pipeline import profile
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.measure import timed_runs
from scripts.pipeline.records import Record, optional

if TYPE_CHECKING:
    from scripts.checks.record_text import RecordTokens


def interpreter(path, threads: int | None = None, dynamic_kernels: bool = False):
    """The graph on LiteRT's CPU accelerator, its packed weights shared by its signatures in a cache
    file (scripts/litert/cpu_graph.py): the interpreter every check and command runs, in the graph's
    exact form unless `dynamic_kernels` (integer weights read by XNNPACK's dynamic kernels, as stored)."""
    from scripts.litert.cpu_graph import CpuGraph

    return CpuGraph(path, threads, dynamic_kernels)


RECORD_KINDS = records.ROW_KINDS
REFERENCE_KIND = "padded"  # the record a graph's reference record (scripts/release/references.py) carries


RowRecords = dict[str, tuple[int, Tensors]]
"""A row graph's host-built records by kind: {kind: (real tokens, named graph inputs)} (row_records)."""


def row_records(host, length: int, text: RecordTokens, kinds=RECORD_KINDS) -> RowRecords:
    """The host-built records a row graph is checked on, of `text`: {kind: (real tokens, inputs)}: all L
    tokens, a right-padded record, and a single token (the most padding); `kinds` of them."""
    out = {}
    real = records.row_tokens(length)
    for kind in kinds:
        n = getattr(real, kind)
        inputs = host.record(text.ids(n, 11 * length + n), length)
        host.check(inputs, length)
        out[kind] = (n, inputs)
    return out


@dataclass(frozen=True)
class TorchReference:
    """What a record is checked against, from the torch row graph: its hidden [n, H] at the n real
    positions, and the same with the memory-cut fault where the record spans two chunks (else None)."""

    hidden: torch.Tensor
    memory_cut: torch.Tensor | None


def torch_reference(graph, inputs: Tensors, n: int, form) -> TorchReference:
    """The record's TorchReference. Computed before the interpreter loads, so the stack can be freed
    first (scripts/checks/controls.py: the memory-cut fault)."""
    from scripts.checks import controls
    from scripts.qwen35 import model_change

    with torch.no_grad(), profile.part("torch"):
        hidden, memory_cut = graph(**inputs)["hidden"][0, :n], None
        if controls.memory_cut_applies(form, n):
            with model_change.changed(graph.text_model, memory_cut=True):
                memory_cut = graph(**inputs)["hidden"][0, :n]
    return TorchReference(hidden, memory_cut)


@dataclass(frozen=True)
class TfliteRow(Record):
    """One record of a row graph in the interpreter against the torch row graph (results/tflite_L{L}.json
    `rows`, judged by compare.judge as `to_json()`): its kind and real tokens, the two figures, whether
    the output is finite, and the memory-cut control's figure where the control applies."""

    record: str
    n_real: int
    rel_vs_torch: float
    rel_per_position_vs_torch: float
    finite: bool
    control_memory_cut_rel_vs_torch: float | None = optional()


def record_row(kind: str, n: int, lite: torch.Tensor, reference: TorchReference) -> TfliteRow:
    """One record's row: the interpreter's hidden [1, L, H] vs the torch row graph's at the n real
    positions (scripts/checks/compare.py), and the memory-cut control where it applies: the same file
    against the torch graph with the fault (torch_reference)."""
    from scripts.checks import compare

    lite = lite[0, :n]
    return TfliteRow(
        record=kind,
        n_real=n,
        **compare.figures("vs_torch", lite, reference.hidden),
        finite=bool(torch.isfinite(lite).all()),
        control_memory_cut_rel_vs_torch=None
        if reference.memory_cut is None
        else compare.rel(lite, reference.memory_cut),
    )


def run(runner, inputs: dict) -> torch.Tensor:
    out = runner(**{k: v.numpy().astype(np.float32) for k, v in inputs.items()})
    return torch.from_numpy(out["hidden"].copy())


def torch_times(graph, inputs: dict, repeats: int, budget_seconds: float | None = None) -> list[float]:
    """Seconds of each timed run of the torch row graph on a record (one warm-up first; measure.timed_runs)."""
    with torch.no_grad():
        return timed_runs(lambda: graph(**inputs), repeats, budget_seconds)


def litert_times(runner, inputs: dict, repeats: int, budget_seconds: float | None = None) -> list[float]:
    """Seconds of each timed run of the interpreter on a record (one warm-up first; measure.timed_runs)."""
    feeds = {k: v.numpy().astype(np.float32) for k, v in inputs.items()}
    return timed_runs(lambda: runner(**feeds), repeats, budget_seconds)


@dataclass(frozen=True)
class TimedRuns(Record):
    """How many runs each side of a latency measurement timed."""

    litert: int
    torch: int


@dataclass(frozen=True)
class Latency(Record):
    """A graph's latency against the torch row graph (results/tflite_L{L}.json `latency`): the two
    medians, their ratio, the runs asked for and timed, and the time budget when one was set."""

    litert_median_s: float
    torch_median_s: float
    torch_over_litert: float
    repeats: int
    timed_runs: TimedRuns
    budget_seconds: float | None = optional()


def latency(litert: list[float], torch_: list[float], repeats: int, budget_seconds: float | None = None) -> Latency:
    """The two medians of the timed runs, measured in one process one after the other (torch first,
    then the stack is freed and the interpreter loads: the two never share memory), their ratio, and
    how many runs each side timed (`repeats` at most; fewer once `budget_seconds` were spent)."""
    litert_s, torch_s = statistics.median(litert), statistics.median(torch_)
    return Latency(
        litert_median_s=litert_s,
        torch_median_s=torch_s,
        torch_over_litert=torch_s / litert_s,
        repeats=repeats,
        timed_runs=TimedRuns(litert=len(litert), torch=len(torch_)),
        budget_seconds=budget_seconds,
    )
