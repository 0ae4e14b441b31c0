"""`make quantization-trace`: which Linear weights cost the decisions at a low precision, traced in torch
-> <workspace>/results/quantization_trace.json.

The weights bench gives one decision figure per precision; this says where it comes from. For each
precision traced (int8, int4, int4b32), the torch row graph (L=64, float32) is scored on the decision
windows (scripts/checks/decision_check.py, against stock float64 with the checkpoint's weights) with
every Linear at the precision, then with one group of Linears at a time at it and the rest unquantized:
each role (a weight's name after `layers.N.`: mlp.down_proj, linear_attn.in_proj_qkv, ...) over every
layer, and each layer with all its Linears. No graph is converted: the figures are the weights' alone,
the part of the CPU's and GPU's figures that the storage costs (the graphs add their own rounding).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import time
from pathlib import Path

import torch

from scripts.checkpoint import snapshot
from scripts.checks import decision_check, gpu_check, record_text
from scripts.checks.decision import DecisionFigures
from scripts.layers import kernel_form, weight_precision
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host

TRACED = ("int8", "int4", "int4b32")
TRACE_L = 64
RESULT = "quantization_trace"
_LAYER = re.compile(r"layers\.(\d+)\.(.+)\.weight$")


@dataclasses.dataclass(frozen=True)
class GroupFigures(Record):
    """One group of Linears quantized alone: how many, and the decision figures."""

    linears: int
    decision: DecisionFigures


@dataclasses.dataclass(frozen=True)
class PrecisionTrace(Record):
    """Every Linear at the precision, then each role and each layer alone."""

    all_linears: DecisionFigures
    by_role: dict[str, GroupFigures]
    by_layer: dict[str, GroupFigures]
    # every Linear at the precision but the first layer's, kept at {the checkpoint's (bf16), int8}: the
    # mixed recipe the first layer's cost suggests (the `weights` grammar cannot say it)
    first_layer_kept: dict[str, DecisionFigures] | None = optional()


@dataclasses.dataclass(frozen=True)
class QuantizationTrace(Record):
    """results/quantization_trace.json."""

    workspace: str
    source: str
    form: str
    L: int
    scored_tokens: int
    measured_utc: str
    precisions: dict[str, PrecisionTrace]
    seconds: float


def groups(model) -> tuple[dict[str, list], dict[str, list]]:
    """The model's layer Linears by role and by layer: {name: [nn.Linear]}."""
    by_role: dict[str, list] = {}
    by_layer: dict[str, list] = {}
    for name, m in weight_precision.linears(model):
        found = _LAYER.search(name + ".weight")
        if found:
            by_layer.setdefault(found.group(1), []).append(m)
            by_role.setdefault(found.group(2), []).append(m)
    if not by_role:
        raise ClefError(f"{type(model).__name__} holds no layer Linears to trace")
    return by_role, dict(sorted(by_layer.items(), key=lambda kv: int(kv[0])))


@contextlib.contextmanager
def quantized(linears: list, weights: str):
    """Each Linear's weight at `weights` inside the block; the float32 weights put back after."""
    saved = [m.weight.detach().clone() for m in linears]
    try:
        with torch.no_grad():
            for m in linears:
                m.weight.copy_(weight_precision.stored_values(m.weight, weights))
        yield
    finally:
        with torch.no_grad():
            for m, w in zip(linears, saved, strict=True):
                m.weight.copy_(w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", type=Path, default=Path("."))
    ws = ap.parse_args().workspace
    if not (ws / "results/snapshot.json").is_file():
        raise ClefError(f"no pipeline run in {ws}: run make release first")
    p = params.load(["form", "model.source", "decision"], path=ws / "params.yaml")
    form = str(kernel_form.parse(p["form"]))
    snap = snapshot.verify(snapshot.load_record(ws / "results/snapshot.json"), root=ws)
    host = Host(snap)
    text = record_text.for_source(p["model"]["source"], host)
    if text.kind != record_text.HELD_OUT_TEXT:
        raise ClefError(f"model.source {p['model']['source']}: no held-out text to score decisions on")
    clock = time.monotonic()
    windows = decision_check.scoring_set(text, TRACE_L, p["decision"]["scored_tokens"])
    model, _, _ = patch.load(snap, form, progress=False)
    truth = decision_check.truth(gpu_check.StockReferences(model), host, windows)
    inputs = windows.records(host)
    graph = row_graph.ClefRowPrefill(model, TRACE_L).eval()

    def score() -> DecisionFigures:
        with torch.no_grad():
            return decision_check.figures(host, windows, truth, [graph(**r)["hidden"][0] for r in inputs])

    by_role, by_layer = groups(model)
    every = [m for ms in by_layer.values() for m in ms]
    traced = {}
    for weights in TRACED:
        with quantized(every, weights):
            whole = score()

        def alone(found: dict[str, list], weights=weights) -> dict[str, GroupFigures]:
            out = {}
            for name, ms in found.items():
                with quantized(ms, weights):
                    out[name] = GroupFigures(linears=len(ms), decision=score())
            return out

        first, rest = by_layer[next(iter(by_layer))], [m for ms in list(by_layer.values())[1:] for m in ms]
        kept = {}
        with quantized(rest, weights):
            kept["bf16"] = score()
            if weights != "int8":
                with quantized(first, "int8"):
                    kept["int8"] = score()
        traced[weights] = PrecisionTrace(
            all_linears=whole, by_role=alone(by_role), by_layer=alone(by_layer), first_layer_kept=kept
        )
        worst = max(traced[weights].by_role.items(), key=lambda kv: kv[1].decision.kld_mean)
        print(
            f"quantization-trace {weights}: all {decision_check.shown(whole)}; costliest role {worst[0]} "
            f"{decision_check.shown(worst[1].decision)}",
            flush=True,
        )
    doc = QuantizationTrace(
        workspace=str(ws),
        source=p["model"]["source"],
        form=form,
        L=TRACE_L,
        scored_tokens=windows.actual.numel(),
        measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        precisions=traced,
        seconds=time.monotonic() - clock,
    )
    out = ws / layout.result_path(RESULT)
    atomic.write_json(out, doc.to_json())
    print(f"quantization-trace -> {out}")


if __name__ == "__main__":
    run_stage(main)
