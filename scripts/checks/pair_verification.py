"""verify_pair's work for one pair: the pair checked in torch, then in the LiteRT interpreter
(scripts/checks/pair_check.py: chaining against the row graph, the prefix's hidden too, its state
against transformers' cache in float64, state reuse), with its op census and metadata (verify ->
PairFindings); then judged against the bounds (global and per position), each control (the recurrent
state zeroed, the pad guard removed: scripts/checks/controls.py) held to break the chaining bound by
controls.min_over_threshold, into the summary the release and check_params read (PairSummary), the
record, its metrics row and its line, as scripts/checks/finish.py takes them (result)."""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.checks import compare, decision_check, gpu_check, pair_check, record_text, tflite_check
from scripts.checks.decision_check import DecisionRecord
from scripts.checks.finish import CheckResult, GraphFindings
from scripts.layers import weight_precision
from scripts.litert import tflite_file
from scripts.pipeline import layout
from scripts.pipeline.progress import Phases
from scripts.pipeline.records import Record
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host, PairRunner, litert_signature
from scripts.release import references

BOUNDED = ("rel_vs_row", "rel_per_position_vs_row", "rel_state_vs_stock_f64", "rel_per_position_state_vs_stock_f64")
CONTROLS = {"zero_state": "control_zero_state_rel_vs_row", "no_pad_guard": "control_no_pad_guard_rel_vs_row"}


@dataclass(frozen=True)
class PerBackend(Record):
    """The worst of one figure over each backend's rows (None where a backend has none)."""

    torch: float | None
    litert: float | None

    def worst(self) -> float | None:
        """The larger of the two (NaN wins: compare.largest)."""
        return compare.largest([self.torch, self.litert])


BACKENDS = tuple(f.name for f in dataclasses.fields(PerBackend))


def torch_fn(module):
    """A torch signature module as PairRunner calls a signature: keyword inputs -> {name: tensor}."""

    def call(**inputs):
        with torch.no_grad():
            return dict(module(**inputs))

    return call


@dataclass(frozen=True)
class PairFindings(GraphFindings):
    """GraphFindings of a pair of prefix P and suffix S; each row names its backend."""

    P: int
    S: int
    decision: DecisionRecord | None = None  # None: model.source synthetic (decision_check.NO_DECISIONS)


PHASES = (
    "load the stack",
    "decision truth",
    "torch checks",
    "interpreter",
    "LiteRT checks",
    "decision windows",
    "reference record",
)


def verify(
    path: Path, rec: SnapshotRecord, snap, form: str, weights: str, P: int, S: int, decision_section: dict
) -> PairFindings:
    """The pair at `path` checked in torch, then in the LiteRT interpreter, and its reference record saved
    (results/references/) and read back through it. Torch first: its checks fill the References (the row
    graph's and transformers' results, kept); then the stack is freed and the interpreter's checks read
    them, so the weights are never in memory twice."""
    with Phases(f"verify_pair P={P} S={S}", PHASES) as phase:
        phase("load the stack")
        model, _, _ = patch.load(snap, form)
        host = Host(snap)
        text = record_text.for_source(rec.source, host)
        scoring = truth = None
        if text.kind == record_text.HELD_OUT_TEXT:  # the truth with the checkpoint's own weights, then stored
            phase("decision truth")
            scoring = decision_check.scoring_set(text, P + S, decision_section["pair_scored_tokens"])
            truth = decision_check.truth(gpu_check.StockReferences(model), host, scoring)
        weight_precision.apply(model, weights)
        census = tflite_file.census(path)
        meta = tflite_file.read_metadata(path)
        problems = [f"census: {v}" for v in tflite_file.violations(census)]
        if set(census["signatures"]) != {"prefix", "suffix"}:
            problems.append(f"signatures {sorted(census['signatures'])}, expected prefix and suffix")
        expected = {"revision": rec.revision, "form": form, "weights": weights, "kind": "pair", "P": P, "S": S}
        problems += [f"metadata: {m}" for m in tflite_file.metadata_mismatches(meta, expected)]

        phase("torch checks")
        shapes = pair_graph.state_shapes(model, P)
        refs = pair_check.References(model, host, P, S)
        prefix, suffix = pair_graph.PairPrefix(model, P).eval(), pair_graph.PairSuffix(model, P, S).eval()
        runner = PairRunner(host, torch_fn(prefix), torch_fn(suffix), P, S, form, shapes)
        rows = [{"backend": "torch", **r} for r in pair_check.check(runner, refs, text, pad_guard_control=True)]
        # the release packages it; `clef verify` reruns it wherever it lands
        references.save(pair_check.reference_record(refs, host, text), layout.reference_path(path))
        del runner, model, prefix, suffix
        refs.free()
        gc.collect()

        phase("interpreter")
        interp = tflite_check.interpreter(path)
        signatures = (litert_signature(interp.get_signature_runner(name)) for name in ("prefix", "suffix"))
        runner = PairRunner(host, *signatures, P, S, form, shapes)
        phase("LiteRT checks")
        rows += [{"backend": "litert", **r} for r in pair_check.check(runner, refs, text)]
        made = None
        if scoring is not None:
            phase("decision windows")
            places = {
                "cpu": decision_check.figures(host, scoring, truth, decision_check.pair_hidden(runner, scoring)),
                decision_check.FLOOR: decision_check.floor(host, scoring, truth),
            }
            made = decision_check.record(scoring, places, decision_section, weights)
        # the saved record read back through this graph: the figures the release states for it
        phase("reference record")
        reference = references.measure(path, "pair", interp)
    return PairFindings(path, form, weights, census, meta, problems, rows, reference, P=P, S=S, decision=made)


@dataclass(frozen=True)
class PairSummary(Record):
    """A pair's headline figures, the worst per backend, and its controls' errors over the bound."""

    P: int
    S: int
    form: str
    weights: str
    thresholds: dict[str, float]
    passed: bool
    problems: list[str]
    bytes: int
    max_rel_vs_row: PerBackend
    max_rel_per_position_vs_row: PerBackend
    max_rel_prefix_hidden_vs_row: PerBackend
    max_rel_state_vs_stock_f64: PerBackend
    max_rel_per_position_state_vs_stock_f64: PerBackend
    max_rel_state_vs_stock_fp32: PerBackend
    controls: dict[str, dict]
    controls_required_over_threshold: float


def per_backend(rows: list[dict], key: str, check: str | None = None) -> PerBackend:
    """The worst `key` over each backend's rows (of `check` only, when given)."""
    return PerBackend(
        **{
            b: compare.worst([r for r in rows if r["backend"] == b and check in (None, r["check"])], key)
            for b in BACKENDS
        }
    )


def summary(found: PairFindings, limits: dict[str, float], min_over: float) -> tuple[PairSummary, dict[str, float]]:
    """The findings judged: their summary, and each control's error by `<backend> <control>` (the pad
    guard control runs in torch only)."""
    rows, limit = found.rows, limits["rel_vs_row"]
    problems = found.problems + compare.judge(rows, limits)
    if found.decision is not None:
        problems += decision_check.problems(found.decision)
    controls = {}
    for control, key in CONTROLS.items():
        for b in BACKENDS:
            value = compare.worst([r for r in rows if r["backend"] == b], key)
            if value is not None:
                controls[f"{b} {control}"] = value
                problems += compare.control_problems(f"{control} ({b})", value, limit, min_over)
    doc = PairSummary(
        found.P,
        found.S,
        found.form,
        found.weights,
        limits,
        not problems,
        problems,
        found.path.stat().st_size,
        per_backend(rows, "rel_vs_row"),
        per_backend(rows, "rel_per_position_vs_row"),
        per_backend(rows, "rel_vs_row", "prefix_hidden"),
        per_backend(rows, "rel_state_vs_stock_f64"),
        per_backend(rows, "rel_per_position_state_vs_stock_f64"),
        per_backend(rows, "rel_state_vs_stock_fp32"),
        {name: {"rel_vs_row": v, "over_threshold": compare.margin(v, limit)} for name, v in controls.items()},
        min_over,
    )
    return doc, controls


def result(found: PairFindings, limits: dict[str, float], min_over: float) -> CheckResult:
    """The record (summary, census, metadata, reference record, rows), the metrics row and the line."""
    doc, controls = summary(found, limits, min_over)
    census, P, S = found.census, found.P, found.S
    figures = dict(
        max_rel=doc.max_rel_vs_row.worst(),
        threshold=limits["rel_vs_row"],
        max_rel_per_position=doc.max_rel_per_position_vs_row.worst(),
        threshold_per_position=limits["rel_per_position_vs_row"],
        control_over_threshold=min(c["over_threshold"] for c in doc.controls.values()),
        max_rel_state=doc.max_rel_state_vs_stock_f64.worst(),
        P=P,
        S=S,
        bytes=found.path.stat().st_size,
        op_total=census["op_total"],
        max_rank=census["max_rank"],
        ops_per_gdn_layer=max(census["ops_per_gdn_layer"].values(), default=None),
    )
    shown = {
        k: {b: f"{v:.2e}" for b, v in getattr(doc, k).to_json().items()}
        for k in ("max_rel_vs_row", "max_rel_per_position_vs_row", "max_rel_state_vs_stock_f64")
    }
    line = (
        f"verify_pair P={P} S={S}: chaining max rel {shown['max_rel_vs_row']}, per position "
        f"{shown['max_rel_per_position_vs_row']}, state vs transformers float64 {shown['max_rel_state_vs_stock_f64']}; "
        f"controls {', '.join(f'{k} {v:.3g}' for k, v in controls.items())}; {census['op_total']} ops, "
        f"max rank {census['max_rank']}; "
        + (
            f"decision on {found.decision.scored_tokens} held-out tokens: CPU "
            f"{decision_check.shown(found.decision.places['cpu'])}, torch float16 "
            f"{decision_check.shown(found.decision.places[decision_check.FLOOR])}"
            if found.decision is not None
            else f"no decision figures ({decision_check.NO_DECISIONS})"
        )
    )
    record = {
        "summary": doc.to_json(),
        "census": census,
        "metadata": found.metadata,
        "reference_record": found.reference.to_json(),
        **(
            {"decision": found.decision.to_json()}
            if found.decision is not None
            else {"no_decision": decision_check.NO_DECISIONS}
        ),
        "rows": found.rows,
    }
    name, stage = layout.pair_name(P, S), f"verify_pair P={P} S={S}"
    return CheckResult(stage, name, record, layout.result_path(name), figures, [line], doc.problems)
