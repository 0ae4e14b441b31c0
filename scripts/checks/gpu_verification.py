"""verify_gpu's work for one graph (a row graph of length L or a pair of prefix P and suffix S): the
graph compiled for LiteRT's GPU accelerator alone and run in each mode (scripts/checks/gpu_check.py:
fp32, fp16 and mixed, each first shown by its effect on the precision probe), in sections of at most
verify_gpu.section_fraction of the stack's weights, never under verify_gpu.section_min_bytes
(scripts/litert/sections.py: the accelerator holds several times what it compiles) and of
verify_gpu.section_work / tokens (it waits about two minutes for a run), over the layers
verify_gpu.layers names (the first block: its residual stream against the first block in torch).

The torch references come first (every one: the graph in torch, stock float64 and float16, one layer
at a time); then the stack is freed and each mode runs section by section, so the weights are never in
memory twice (rows). The record (result): fully accelerated or not, every row, each mode's figures and
its probe, the sections, the accelerator's time; the problems: a partial acceleration, a non-finite
output, an fp32 error over the bound, or a mode of verify_gpu.held_to_floor over fp16_max_over_floor x
the torch-float16 floor (global or per position). An int8 graph the accelerator refuses is recorded
with the op it refuses, not failed (refused).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path

from scripts.checks import decision_check, gpu_check, record_text, tflite_check
from scripts.checks.decision_check import DecisionRecord
from scripts.checks.finish import CheckResult
from scripts.layers import weight_precision
from scripts.litert.export import DEFAULT_SIGNATURE
from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host, PairRunner


@dataclass(frozen=True)
class GraphShape:
    """Which graph verify_gpu checks: a row graph (length) or a pair (prefix, suffix)."""

    length: int | None
    prefix: int | None
    suffix: int | None

    @property
    def is_row(self) -> bool:
        return self.length is not None

    @property
    def kind(self) -> str:
        return "row" if self.is_row else "pair"

    @property
    def shape(self) -> dict[str, int]:
        """As the record holds it: {"L": L} or {"P": P, "S": S}."""
        return {"L": self.length} if self.is_row else {"P": self.prefix, "S": self.suffix}

    @property
    def name(self) -> str:
        """Its metrics row: gpu_row_L{L} or gpu_pair_P{P}_S{S}."""
        return layout.gpu_name(self.length) if self.is_row else layout.gpu_name(prefix=self.prefix, suffix=self.suffix)

    @property
    def tokens(self) -> int:
        """What its longest signature takes."""
        return self.length if self.is_row else max(self.prefix, self.suffix)

    def require(self) -> Path:
        """Its .tflite, or one line naming the stage that exports it."""
        if self.is_row:
            return layout.require(layout.row_path(self.length), f"export@{self.length}")
        return layout.require(layout.pair_path(self.prefix, self.suffix), "export_pair")


def require_first_block_reaches_all(graph, path: Path) -> None:
    """The accelerator is shown only the first block: every op kind of the graph must be in it (a
    sections.SectionedGraph's plans), else one line naming the signature and the kinds it would miss."""
    unreached = {sig: plan.unreached for sig, plan in graph.plans.items() if plan.unreached}
    if unreached:
        sig, kinds = next(iter(unreached.items()))
        raise ClefError(
            f"{path} {sig}: op kinds only after the first block, which the GPU check would not run: {kinds}"
        )


def rows(
    of: GraphShape, snap, form: str, weights: str, layers: int | None, runs: dict, source: str, decision_section: dict
) -> tuple[list[dict], DecisionRecord | None]:
    """Every row of every mode in `runs` (gpu_check.ModeRun) on records of model.source `source`'s tokens
    (scripts/checks/record_text.py), against references computed first, in torch,
    with the stack loaded (with `layers`, the first block only: its residual stream where the graph's
    hidden would be); the stack is freed before any mode runs."""
    model, _, _ = patch.load(snap, form, progress=False, block=layers is not None)
    host = Host(snap)
    text = record_text.for_source(source, host)
    scoring = truth = None
    if layers is None and text.kind == record_text.HELD_OUT_TEXT:  # the unquantized truth first
        window, tokens = (
            (of.length, decision_section["scored_tokens"])
            if of.is_row
            else (of.prefix + of.suffix, decision_section["pair_scored_tokens"])
        )
        scoring = decision_check.scoring_set(text, window, tokens)
        truth = decision_check.truth(gpu_check.StockReferences(model), host, scoring)
    weight_precision.apply(model, weights)
    stock = gpu_check.StockReferences(model)
    with gpu_check.residual_stream(model, stock.twin) if layers else contextlib.nullcontext():
        if of.is_row:
            records = tflite_check.row_records(host, of.length, text, gpu_check.ROW_RECORDS)
            refs = gpu_check.row_references(model, host, stock, records)
        else:
            P, S = of.prefix, of.suffix
            shapes = pair_graph.state_shapes(model, P)
            prefixes = gpu_check.chaining_prefixes(P)
            tokens = {p: text.ids(p + S, 1000 * P + S + p) for p in prefixes}
            first = prefixes[-1]  # the signature check's prefix, also chained
            signature_refs = gpu_check.signature_references(
                pair_graph.PairPrefix(model, P).eval(),
                pair_graph.PairSuffix(model, P, S).eval(),
                host,
                P,
                S,
                tokens[first],
                first,
            )
            chaining_refs = gpu_check.chaining_references(model, host, stock, P, S, tokens)
    del model, stock
    gc.collect()

    found, places = [], {}
    for mode, run in runs.items():  # one mode at a time, one section at a time
        one = {mode: run}
        if of.is_row:
            found += gpu_check.row_rows(one, refs, records)
            if scoring is not None:
                outs = decision_check.one(run(DEFAULT_SIGNATURE, scoring.records(host)))
                places[f"gpu_{mode}"] = decision_check.figures(host, scoring, truth, outs)
        else:
            found += gpu_check.pair_rows(one, host, signature_refs, chaining_refs, P, S, form, shapes)
            if scoring is not None:
                pair = PairRunner(host, None, None, P, S, form, shapes)
                outs = decision_check.batched_pair_hidden(run, pair, scoring)
                places[f"gpu_{mode}"] = decision_check.figures(host, scoring, truth, outs)
    if scoring is None:
        return found, None
    places[decision_check.FLOOR] = decision_check.floor(host, scoring, truth)
    return found, decision_check.record(scoring, places, decision_section, weights)


@dataclass(frozen=True)
class GpuFindings:
    """What verify_gpu found for one graph before it is judged."""

    of: GraphShape
    path: Path
    form: str
    weights: str
    census: dict
    layers_checked: int  # the decoder layers the accelerator ran: hidden is their residual stream when not all
    layers: int
    graph: object  # the sections.SectionedGraph it ran: its plans and section limit
    runs: dict  # {mode: gpu_check.ModeRun}
    rows: list[dict]
    decision: DecisionRecord | None = None  # graphs run whole (verify_gpu.layers: all) on held-out text only


def result(found: GpuFindings, bounds: gpu_check.GpuBounds) -> CheckResult:
    """The record (results/gpu/<name>.json), the metrics row and the line."""
    runs, path, of = found.runs, found.path, found.of
    limit, over_floor = bounds.max_rel_fp32, bounds.fp16_max_over_floor
    figures, problems = gpu_check.summary(found.rows, bounds)
    for mode, run in runs.items():
        figures["modes"][mode].update(fully_accelerated=run.fully_accelerated, probe=run.proof.to_json())
    accelerated = all(run.fully_accelerated for run in runs.values())
    if not accelerated:
        problems.insert(0, "is_fully_accelerated() is false")
    made = found.decision
    if made is not None:
        problems += decision_check.problems(made)
    device = runs["fp32"].device
    doc = {
        "graph": str(path),
        "form": found.form,
        "weights": found.weights,
        "kind": of.kind,
        **of.shape,
        "passed": not problems,
        "problems": problems,
        "device": device.to_json(),
        "fully_accelerated": accelerated,
        "layers_checked": found.layers_checked,
        "layers": found.layers,
        "signatures": sorted(found.census["signatures"]),
        "sections": {
            sig: [{"ops": [sec.ops.start, sec.ops.stop], "constant_bytes": sec.constant_bytes} for sec in plan.sections]
            for sig, plan in found.graph.plans.items()
        },
        "section_limit_bytes": found.graph.max_bytes,
        "accelerator_seconds": {mode: round(run.seconds, 3) for mode, run in runs.items()},
        "threshold_fp32": limit,
        "threshold_per_position_fp32": bounds.max_rel_per_position_fp32,
        **figures,
        "decision": made.to_json() if made is not None else None,
        "rows": found.rows,
    }
    metrics_row = dict(
        max_rel=figures["fp32_max_rel_vs_torch"],
        threshold=limit,
        max_rel_per_position=figures["fp32_max_rel_per_position_vs_torch"],
        threshold_per_position=bounds.max_rel_per_position_fp32,
        fp16_max_rel=figures["fp16_max_rel_vs_f64"],
        fp16_over_floor=figures["fp16_over_floor"],
        mixed_over_floor=figures["modes"]["mixed"]["over_floor"],
        fully_accelerated=accelerated,
        layers_checked=found.layers_checked,
        **of.shape,
    )
    modes = figures["modes"]
    line = (
        f"verify_gpu {path.name} on {device.adapter}, layers {found.layers_checked} of {found.layers}: "
        f"fully accelerated {accelerated}; fp32 max rel vs torch "
        f"{figures['fp32_max_rel_vs_torch']:.2e}, per position {figures['fp32_max_rel_per_position_vs_torch']:.2e} "
        f"(bounds {limit:g}, {bounds.max_rel_per_position_fp32:g}); "
        f"floor (torch float16) {figures['floor_max_rel_vs_f64']:.3g}; "
        + "; ".join(
            f"{m} vs float64 {modes[m]['max_rel_vs_f64']:.3g}, {modes[m]['over_floor']:.2f}x the "
            f"floor ({modes[m]['over_floor_per_position']:.2f}x per position)"
            for m in gpu_check.HALF_MODES
        )
        + f" (target {over_floor:g}x; held to it: {', '.join(bounds.held_to_floor) or 'none'})"
        + (
            f"; decision on {made.scored_tokens} held-out tokens: "
            + ", ".join(f"{place} {decision_check.shown(f)}" for place, f in made.places.items())
            if made is not None
            else ""
        )
    )
    where = layout.gpu_result_path(of.name)
    return CheckResult(f"verify_gpu {path.name}", of.name, doc, where, metrics_row, [line], problems)
