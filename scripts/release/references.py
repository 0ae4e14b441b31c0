"""A graph's reference record: fixed inputs and the torch output the graph must reproduce.

The verify stage that already holds the torch model computes it (verify_tflite for a row graph,
verify_pair for a pair), writes it to results/references/, reads it back and runs it through the graph
in the interpreter it already has open (`measure`): the record's sha256 and its error go beside it.
The release stage packages the record with those figures, once the sha256 shows it is the record
measured, and runs no graph; `clef verify` reruns it wherever the release lands (`run_reference`, or
`reference_error` on the GPU accelerator). Nothing here imports the release's reader or signing code,
so editing those does not rerun the verify stages; nor torch, which `clef verify` does not need: a
record is read and run as numpy arrays there, as torch tensors in the stages, with one error metric.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record

if TYPE_CHECKING:
    from scripts.pipeline.mappings import Tensors


@dataclasses.dataclass(frozen=True)
class ReferenceFigures(Record):
    """results/references/<graph>.json: the reference record measured through its graph by the verify
    stage that wrote it (reference_error's figures), and the sha256 that ties them to the record."""

    record_sha256: str
    rel_vs_expected: float
    rel_per_position_vs_expected: float
    per_position_vs_expected: list[float]  # the figure at each position (the pictures)


@dataclasses.dataclass(frozen=True)
class ReferenceResult(Record):
    """A reference record run through a graph (reference_error): its error against the stored
    expectation, global, at the worst position and at each position (scripts/checks/compare.py)."""

    rel_vs_expected: float
    rel_per_position_vs_expected: float
    per_position_vs_expected: list[float]


def row_reference(record: Tensors, hidden) -> Tensors:
    """A row graph's reference record: its inputs and torch's hidden states [n, H] at its n real
    positions."""
    n = int(record["valid"].sum())
    if hidden.shape[0] != n:
        raise ValueError(f"a row reference needs the hidden at the {n} real positions, got {hidden.shape[0]}")
    return {**record, "expected": hidden[None].contiguous()}


def pair_reference(host, ids: list[int], p: int, prefix: int, suffix: int, row_hidden) -> Tensors:
    """A pair's reference record: both signatures' token inputs (the first p ids in the prefix, the
    rest in the suffix), and the row graph's hidden states over the ids (`row_hidden`) at the suffix
    positions: the chaining rule the pair promises."""
    s = len(ids) - p
    return {
        **{f"prefix.{k}": v for k, v in host.record(ids[:p], prefix).items()},
        **{f"suffix.{k}": v for k, v in host.record(ids[p:], suffix, start=p).items()},
        "expected": row_hidden[:, p : p + s].contiguous(),
    }


def load_reference(root: Path, name: str, arrays: bool = False) -> Tensors:
    """The record `name` under `root`: torch tensors, or numpy arrays with `arrays` (no torch needed)."""
    if arrays:
        from safetensors.numpy import load_file
    else:
        from safetensors.torch import load_file

    return load_file(str(Path(root) / name))


def float32(v):
    """A record's tensor or array as float32, of the same kind."""
    return v.astype(np.float32) if isinstance(v, np.ndarray) else v.float()


def reference_error(signature, kind: str, record: Tensors) -> ReferenceResult:
    """Run a reference record through a graph's signatures; -> its error against the stored
    expectation, global and per position (scripts/checks/compare.py: rel_vs_expected,
    rel_per_position_vs_expected, inf if an output is not finite). `signature(name)` gives a signature
    (None: the only one) as a callable on named torch tensors returning a dict of them: the
    interpreter's (run_reference) or the GPU accelerator's (scripts/litert/gpu_accelerator.py). The record
    may hold numpy arrays instead (load_reference's `arrays`), for a signature that takes them."""
    from scripts.checks import compare

    feed = {k: float32(v) for k, v in record.items() if k != "expected"}
    expected = record["expected"]
    if kind == "row":
        out = signature(None)(**feed)["hidden"]
    elif kind == "pair":
        first = signature("prefix")(**{k[7:]: v for k, v in feed.items() if k.startswith("prefix.")})
        state = {k: v for k, v in first.items() if k != "hidden"}
        tokens = {k[7:]: v for k, v in feed.items() if k.startswith("suffix.")}
        out = signature("suffix")(**tokens, **state)["hidden"]
    else:
        raise ClefError(f"unknown artifact kind {kind!r}")
    return ReferenceResult(**compare.figures("vs_expected", out[:, : expected.shape[1]], expected, curve=True))


def run_reference(
    path: Path, kind: str, record: Tensors, threads: int | None = None, names: dict[str, str] | None = None
) -> ReferenceResult:
    """reference_error in the LiteRT interpreter; `names`: the graph's signatures are these in the file
    (a bundle's: renamed). A record of numpy arrays runs without torch."""
    from scripts.litert.cpu_graph import CpuGraph

    graph = CpuGraph(path, threads)
    arrays = all(isinstance(v, np.ndarray) for v in record.values())
    signature = array_signature(graph) if arrays else interpreter_signature(graph)
    return reference_error(renamed(signature, names) if names else signature, kind, record)


def renamed(signature, names: dict[str, str]):
    """`signature(name)` over a file that holds a graph's signatures under other names (a bundle),
    called with the graph's own names (None: a row's only one) -> the file's."""
    return lambda name: signature(names[name if name is not None else next(iter(names))])


def interpreter_signature(graph):
    """`signature(name)` for reference_error over a graph open in the interpreter
    (scripts/checks/tflite_check.py's interpreter)."""
    from scripts.qwen35.host import litert_signature

    return lambda name: litert_signature(graph.get_signature_runner(*([name] if name else [])))


def array_signature(graph):
    """`signature(name)` for reference_error over a graph open in the interpreter, on numpy arrays."""

    def signature(name):
        runner = graph.get_signature_runner(*([name] if name else []))
        return lambda **feeds: {k: v.copy() for k, v in runner(**feeds).items()}

    return signature


def measure(graph_path: Path, kind: str, graph) -> ReferenceFigures:
    """The record saved for the graph at `graph_path` (layout.reference_path), read back and run
    through `graph` (scripts/litert/cpu_graph.py's CpuGraph, open on that file) -> {record_sha256,
    rel_vs_expected, rel_per_position_vs_expected} (reference_error, as `clef verify` computes
    it), also written to layout.reference_figures_path for the release."""
    from scripts.checkpoint import snapshot
    from scripts.pipeline import atomic, layout

    path = layout.reference_path(graph_path)
    record = load_reference(path.parent, path.name)
    error = reference_error(interpreter_signature(graph), kind, record)
    figures = ReferenceFigures(snapshot.sha256_file(path), **error.to_json())
    atomic.write_json(layout.reference_figures_path(graph_path), figures.to_json())
    return figures


def save(record: dict, path: Path) -> None:
    from safetensors.torch import save

    from scripts.pipeline import atomic

    atomic.write_bytes(path, save(record))
