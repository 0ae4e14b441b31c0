"""Run a row graph `.tflite` in the LiteRT interpreter against the torch row graph: accuracy at the
real positions, and latency as a ratio measured in the same run (medians of interleaved rounds)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch


def interpreter(path, threads: int | None = None):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=threads or torch.get_num_threads())
    return it


def row_records(host, length: int, vocab: int) -> dict:
    """The host-built records a row graph is checked on: {kind: (real tokens, inputs)}: all L tokens,
    a right-padded record, and a single token (the most padding)."""
    from scripts.checks.model_check import random_ids

    out = {}
    for kind, n in {"full": length, "padded": length - length // 3, "one_token": 1}.items():
        inputs = host.record(random_ids(n, vocab, 11 * length + n), length)
        host.check(inputs, length)
        out[kind] = (n, inputs)
    return out


def record_row(kind: str, n: int, lite: torch.Tensor, graph, inputs: dict, form) -> dict:
    """One record's row: the interpreter's hidden [1, L, H] vs the torch row graph's at the n real
    positions (scripts/checks/compare.py), and where a record spans two chunks the memory-cut control: the
    same file against the torch graph with the fault (scripts/checks/controls.py)."""
    from scripts.checks import compare, controls

    lite = lite[0, :n]
    with torch.no_grad():
        ref = graph(**inputs)["hidden"][0, :n]
    row = {
        "record": kind,
        "n_real": n,
        **compare.figures("vs_torch", lite, ref),
        "finite": bool(torch.isfinite(lite).all()),
    }
    if controls.memory_cut_applies(form, n):
        with torch.no_grad(), controls.memory_cut(graph.text_model, form):
            row["control_memory_cut_rel_vs_torch"] = compare.rel(lite, graph(**inputs)["hidden"][0, :n])
    return row


def run(runner, inputs: dict) -> torch.Tensor:
    out = runner(**{k: v.numpy().astype(np.float32) for k, v in inputs.items()})
    return torch.from_numpy(out["hidden"].copy())


def latency(runner, graph, inputs: dict, repeats: int) -> dict:
    """Median seconds of interpreter and torch eager on the same record, taking turns each round."""
    feeds = {k: v.numpy() for k, v in inputs.items()}
    lite, eager = [], []
    with torch.no_grad():
        runner(**feeds)
        graph(**inputs)
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner(**feeds)
            lite.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            graph(**inputs)
            eager.append(time.perf_counter() - t0)
    a, b = statistics.median(lite), statistics.median(eager)
    return {"litert_median_s": a, "torch_median_s": b, "torch_over_litert": b / a, "repeats": repeats}
