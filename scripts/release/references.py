"""A graph's reference record: fixed inputs and the torch output the graph must reproduce.

The verify stage that already holds the torch model computes it (verify_tflite for a row graph,
verify_pair for a pair), writes it to results/references/, reads it back and runs it through the graph
in the interpreter it already has open (`measure`): the record's sha256 and its error go beside it.
The release stage packages the record with those figures, once the sha256 shows it is the record
measured, and runs no graph; `clef verify` reruns it wherever the release lands.
"""

from __future__ import annotations

from pathlib import Path

import torch


def row_reference(record: dict, hidden: torch.Tensor) -> dict:
    """A row graph's reference record: its inputs and torch's hidden states [n, H] at its n real
    positions."""
    n = int(record["valid"].sum())
    if hidden.shape[0] != n:
        raise ValueError(f"a row reference needs the hidden at the {n} real positions, got {hidden.shape[0]}")
    return {**record, "expected": hidden[None].contiguous()}


def pair_reference(host, ids: list[int], p: int, prefix: int, suffix: int, row_hidden: torch.Tensor) -> dict:
    """A pair's reference record: both signatures' token inputs (the first p ids in the prefix, the
    rest in the suffix), and the row graph's hidden states over the ids (`row_hidden`) at the suffix
    positions: the chaining rule the pair promises."""
    s = len(ids) - p
    return {
        **{f"prefix.{k}": v for k, v in host.record(ids[:p], prefix).items()},
        **{f"suffix.{k}": v for k, v in host.record(ids[p:], suffix, start=p).items()},
        "expected": row_hidden[:, p : p + s].contiguous(),
    }


def measure(graph_path: Path, kind: str, graph) -> dict:
    """The record saved for the graph at `graph_path` (layout.reference_path), read back and run
    through `graph` (scripts/litert/cpu_graph.py's CpuGraph, open on that file) -> {record_sha256,
    rel_vs_expected, rel_per_position_vs_expected} (reader.reference_error, as `clef verify` computes
    it), also written to layout.reference_figures_path for the release."""
    from scripts.checkpoint import snapshot
    from scripts.pipeline import atomic, layout
    from scripts.release import reader

    path = layout.reference_path(graph_path)
    record = reader.load_reference(path.parent, path.name)
    figures = {
        "record_sha256": snapshot.sha256_file(path),
        **reader.reference_error(reader.interpreter_signature(graph), kind, record),
    }
    atomic.write_json(layout.reference_figures_path(graph_path), figures)
    return figures


def save(record: dict, path: Path) -> None:
    from safetensors.torch import save

    from scripts.pipeline import atomic

    atomic.write_bytes(path, save(record))
