"""verify_tflite's work for one row graph: artifacts/rows/row_L{L}.tflite in the LiteRT interpreter
against the torch row graph (scripts/checks/tflite_check.py), in its exact form (integer weights read
through a DEQUANTIZE: scripts/litert/cpu_graph.py), then, for integer weights, as stored (XNNPACK's
dynamic kernels, which round the activations to int8) against that form, with its op census read from the file,
its metadata, its latency and the effect of the stored weights (verify -> TfliteFindings); then judged
into the record (TfliteRecord), its metrics row and its line, as scripts/checks/finish.py takes them
(result). Problems: an error over a bound (global or per position), a census violation (rank > 4,
custom / STABLEHLO / WHILE / CUMSUM / GATHER_ND ops, int64 tensors), a metadata mismatch, or the
memory-cut control (the torch graph with the fault, against the file) not breaking the global bound by
controls.min_over_threshold."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.checks import compare, decision_check, gpu_check, quantization_effect, record_text, tflite_check
from scripts.checks.decision_check import DecisionRecord
from scripts.checks.finish import CheckResult, GraphFindings
from scripts.checks.quantization_effect import QuantizationEffect, QuantizationRow
from scripts.layers import weight_precision
from scripts.litert import tflite_file
from scripts.pipeline import layout
from scripts.pipeline.progress import Phases
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host
from scripts.release import references
from scripts.release.references import ReferenceFigures

BOUNDED = ("rel_vs_torch", "rel_per_position_vs_torch", "rel_dynamic_kernels", "rel_per_position_dynamic_kernels")
MEMORY_CUT = (
    "the torch graph with the state zeroed at each chunk boundary, against the "
    "file (none where no record spans two chunks)"
)


@dataclass(frozen=True)
class TfliteFindings(GraphFindings):
    """GraphFindings of a row graph of length L, with the weights as stored (weight_precision.Applied),
    each record's row against the unquantized model (scripts/checks/quantization_effect.py), and the
    latency of both torch and LiteRT."""

    length: int
    applied: weight_precision.Applied
    effect: list[QuantizationRow]
    timing: tflite_check.Latency
    decision: DecisionRecord | None = None  # None: model.source synthetic (decision_check.NO_DECISIONS)


PHASES = (
    "load the stack",
    "torch references",
    "torch timing",
    "interpreter",
    "LiteRT records",
    "reference record",
    "dynamic kernels",
    "decision windows",
    "LiteRT timing",
)


def verify(
    path: Path,
    rec: SnapshotRecord,
    snap,
    form: str,
    weights: str,
    length: int,
    repeats: int,
    budget: float,
    decision_section: dict,
) -> TfliteFindings:
    """The row graph at `path` in the LiteRT interpreter against the torch row graph, its reference record
    saved (results/references/) and read back through it, and both timed (`repeats` runs at most, within
    `budget` seconds) -> TfliteFindings. Torch first: the unquantized truth, then (the weights stored at
    `weights`) the references, the controls' outputs and torch's latency; then the stack is freed and
    the interpreter loads, so the weights are never in memory twice (params.yaml `memory`)."""
    census = tflite_file.census(path)
    meta = tflite_file.read_metadata(path)
    problems = [f"census: {v}" for v in tflite_file.violations(census)]
    expected = {
        "repo": rec.repo,
        "revision": rec.revision,
        "form": form,
        "weights": weights,
        "kind": "row",
        "L": length,
        "contract_version": row_graph.CONTRACT_VERSION,
    }
    problems += [f"metadata: {m}" for m in tflite_file.metadata_mismatches(meta, expected)]
    with Phases(f"verify_tflite L={length}", PHASES) as phase:
        phase("load the stack")
        model, _, _ = patch.load(snap, form)
        host = Host(snap)
        text = record_text.for_source(rec.source, host)
        records = tflite_check.row_records(host, length, text)
        phase("torch references")
        truths = quantization_effect.truths(model, records)
        scoring = truth = None
        if text.kind == record_text.HELD_OUT_TEXT:  # the decision truth and floor, unquantized weights too
            scoring = decision_check.scoring_set(text, length, decision_section["scored_tokens"])
            truth = decision_check.truth(gpu_check.StockReferences(model), host, scoring)
        applied = weight_precision.apply(model, weights)
        graph = row_graph.ClefRowPrefill(model, length).eval()
        expected = {kind: tflite_check.torch_reference(graph, inputs, n, form) for kind, (n, inputs) in records.items()}
        # the release packages the padded record (two thirds of L real); `clef verify` reruns it wherever it lands
        padded = records[tflite_check.REFERENCE_KIND][1]
        references.save(
            references.row_reference(padded, expected[tflite_check.REFERENCE_KIND].hidden),
            layout.reference_path(path),
        )
        phase("torch timing")
        timed = host.record(text.ids(length, length), length)
        torch_runs = tflite_check.torch_times(graph, timed, repeats, budget)
        del graph, model
        gc.collect()

        phase("interpreter")
        interp = tflite_check.interpreter(path)  # the exact form: integer weights through a DEQUANTIZE
        runner = interp.get_signature_runner()
        phase("LiteRT records")
        outputs = {kind: tflite_check.run(runner, inputs) for kind, (_, inputs) in records.items()}
        rows = [
            tflite_check.record_row(kind, n, outputs[kind], expected[kind]).to_json()
            for kind, (n, _) in records.items()
        ]
        # the saved record read back through this graph: the figures the release states for it
        phase("reference record")
        reference = references.measure(path, "row", interp)
        if interp.dequantized:  # the file as stored: XNNPACK's dynamic kernels, what a device's CPU runs
            phase("dynamic kernels")
            interp.close()
            interp = tflite_check.interpreter(path, dynamic_kernels=True)
            runner = interp.get_signature_runner()
            for row, (kind, (n, inputs)) in zip(rows, records.items(), strict=True):
                stored = tflite_check.run(runner, inputs)
                row.update(compare.figures("dynamic_kernels", stored[0, :n], outputs[kind][0, :n]))
                outputs[kind] = stored
        effect = [
            quantization_effect.row(kind, n, outputs[kind][0, :n], truths[kind], host)
            for kind, (n, _) in records.items()
        ]
        made = None
        if scoring is not None:
            phase("decision windows")
            cpu = [tflite_check.run(runner, r)[0] for r in scoring.records(host)]
            places = {
                "cpu": decision_check.figures(host, scoring, truth, cpu),
                decision_check.FLOOR: decision_check.floor(host, scoring, truth),
            }
            made = decision_check.record(scoring, places, decision_section, weights)
        phase("LiteRT timing")
        timing = tflite_check.latency(
            tflite_check.litert_times(runner, timed, repeats, budget), torch_runs, repeats, budget
        )
        interp.close()
    return TfliteFindings(
        path,
        form,
        weights,
        census,
        meta,
        problems,
        rows,
        reference,
        length=length,
        applied=applied,
        effect=effect,
        timing=timing,
        decision=made,
    )


@dataclass(frozen=True)
class TfliteRecord(Record):
    """results/tflite_L{L}.json: the graph's figures against the bounds, every row, the census, the
    metadata, the reference record's figures and the latency."""

    L: int
    form: str
    file: str
    bytes: int
    thresholds: dict[str, float]
    passed: bool
    problems: list[str]
    rows: list[dict]
    max_rel_vs_torch: float | None
    max_rel_per_position_vs_torch: float | None
    weights: dict
    quantization_effect: QuantizationEffect
    control_memory_cut: dict
    census: dict
    metadata: dict
    reference_record: ReferenceFigures
    latency: tflite_check.Latency
    decision: DecisionRecord | None = optional()
    no_decision: str | None = optional()
    # integer weights: the file as stored (XNNPACK's dynamic kernels) against its exact form, every record
    max_rel_dynamic_kernels: float | None = optional()
    max_rel_per_position_dynamic_kernels: float | None = optional()


def record(found: TfliteFindings, limits: dict[str, float], min_over: float) -> TfliteRecord:
    """The findings judged: accuracy against `limits`, the memory-cut control against the global bound."""
    rows, limit = found.rows, limits["rel_vs_torch"]
    problems = found.problems + [f"accuracy: {line}" for line in compare.judge(rows, limits)]
    control = compare.worst(rows, "control_memory_cut_rel_vs_torch")
    problems += compare.control_problems("memory_cut", control, limit, min_over)
    if found.decision is not None:
        problems += decision_check.problems(found.decision)
    return TfliteRecord(
        found.length,
        found.form,
        str(found.path),
        found.path.stat().st_size,
        limits,
        not problems,
        problems,
        rows,
        compare.worst(rows, "rel_vs_torch"),
        compare.worst(rows, "rel_per_position_vs_torch"),
        found.applied.to_json(),
        quantization_effect.summary(found.effect),
        {
            "rel_vs_torch": control,
            "over_threshold": compare.margin(control, limit),
            "required_over_threshold": min_over,
            "applies": control is not None,
            "what": MEMORY_CUT,
        },
        found.census,
        found.metadata,
        found.reference,
        found.timing,
        decision=found.decision,
        no_decision=decision_check.NO_DECISIONS if found.decision is None else None,
        max_rel_dynamic_kernels=compare.worst(rows, "rel_dynamic_kernels"),
        max_rel_per_position_dynamic_kernels=compare.worst(rows, "rel_per_position_dynamic_kernels"),
    )


def result(found: TfliteFindings, limits: dict[str, float], min_over: float) -> CheckResult:
    """The record, the metrics row and the line."""
    doc, census, length = record(found, limits, min_over), found.census, found.length
    limit, timing = limits["rel_vs_torch"], found.timing
    gdn_ops = sorted(set(census["ops_per_gdn_layer"].values()))
    figures = dict(
        max_rel=doc.max_rel_vs_torch,
        threshold=limit,
        max_rel_per_position=doc.max_rel_per_position_vs_torch,
        threshold_per_position=limits["rel_per_position_vs_torch"],
        control_over_threshold=doc.control_memory_cut["over_threshold"],
        L=length,
        bytes=found.path.stat().st_size,
        op_total=census["op_total"],
        max_rank=census["max_rank"],
        ops_per_gdn_layer=max(gdn_ops) if gdn_ops else None,
        torch_over_litert=timing.torch_over_litert,
        litert_ms=1e3 * timing.litert_median_s,
    )
    line = (
        f"verify_tflite L={length}: max rel vs torch {doc.max_rel_vs_torch:.2e}, per position "
        f"{doc.max_rel_per_position_vs_torch:.2e} (bounds {limit:g}, {limits['rel_per_position_vs_torch']:g}); "
        f"memory-cut control {compare.shown(doc.control_memory_cut['rel_vs_torch'])}; "
        f"{census['op_total']} ops, {gdn_ops} per GatedDeltaNet, max rank {census['max_rank']}; "
        f"torch/litert time {timing.torch_over_litert:.2f}x; "
        + (
            f"the CPU's dynamic kernels vs the exact form {doc.max_rel_dynamic_kernels:.2e}, per position "
            f"{doc.max_rel_per_position_dynamic_kernels:.2e} (bounds {limits['rel_dynamic_kernels']:g}, "
            f"{limits['rel_per_position_dynamic_kernels']:g}); "
            if doc.max_rel_dynamic_kernels is not None
            else ""
        )
        + f"weights {found.weights}: top-1 agreement with "
        f"the unquantized model {doc.quantization_effect.min_top1_agreement:.3f}; "
        + (
            f"decision on {doc.decision.scored_tokens} held-out tokens: CPU "
            f"{decision_check.shown(doc.decision.places['cpu'])}, torch float16 "
            f"{decision_check.shown(doc.decision.places[decision_check.FLOOR])}"
            if doc.decision is not None
            else f"no decision figures ({doc.no_decision})"
        )
    )
    name = f"tflite_L{length}"
    path = layout.result_path(name)
    return CheckResult(f"verify_tflite L={length}", name, doc.to_json(), path, figures, [line], doc.problems)
