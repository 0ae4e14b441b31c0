"""A graph's reference record: fixed inputs and the torch output the graph must reproduce.

The verify stage that already holds the torch model computes it (verify_tflite for a row graph,
verify_pair for a pair) and writes it to results/references/; the release stage packages it and runs
it through the graph in the interpreter, without loading the model again; `clef verify` reruns it
wherever the release lands.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scripts.checks import model_check
from scripts.qwen35 import row_graph

SEED = 20261129


def row_reference(graph, record: dict) -> dict:
    """A row graph's reference record: its inputs and torch's hidden states at the real positions."""
    n = int(record["valid"].sum())
    with torch.no_grad():
        expected = graph(**record)["hidden"][:, :n]
    return {**record, "expected": expected.contiguous()}


def pair_reference(row, prefix_record: dict, suffix_record: dict, full_record: dict) -> dict:
    """A pair's reference record: both signatures' token inputs, and the row graph's hidden states
    at the suffix positions (the chaining rule the pair promises)."""
    p, s = int(prefix_record["valid"].sum()), int(suffix_record["valid"].sum())
    with torch.no_grad():
        expected = row(**full_record)["hidden"][:, p : p + s]
    return {
        **{f"prefix.{k}": v for k, v in prefix_record.items()},
        **{f"suffix.{k}": v for k, v in suffix_record.items()},
        "expected": expected.contiguous(),
    }


def for_row(model, host, length: int) -> dict:
    """The row graph's record: a right-padded row (two thirds of L real)."""
    ids = model_check.random_ids(length - length // 3, model.config.vocab_size, SEED + length)
    return row_reference(row_graph.ClefRowPrefill(model, length).eval(), host.record(ids, length))


def for_pair(model, host, prefix: int, suffix: int) -> dict:
    """The pair's record: a half-full prefix, then a full suffix, against the row graph over both."""
    p = max(1, prefix // 2)
    ids = model_check.random_ids(p + suffix, model.config.vocab_size, SEED + prefix + suffix)
    return pair_reference(
        row_graph.ClefRowPrefill(model, prefix + suffix).eval(),
        host.record(ids[:p], prefix),
        host.record(ids[p:], suffix, start=p),
        host.record(ids, prefix + suffix),
    )


def save(record: dict, path: Path) -> None:
    from safetensors.torch import save

    from scripts.pipeline import atomic

    atomic.write_bytes(path, save(record))
