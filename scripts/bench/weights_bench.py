"""`make weights-bench`: a workspace's L=64 row graph with its Linear weights stored at each precision,
side by side in one run -> <workspace>/results/weights.json.

For each variant (VARIANTS: fp32, fp16, int8 and int4 read through a DEQUANTIZE, and int8, int4 and
blockwise int4 read by the FULLY_CONNECTED itself: the pipeline's scheme for int8 and int4, the one the
GPU accelerator reads) the stack is loaded with the stored weights, the graph converted and stored,
and on the same host-built records:
- size: the graph's bytes (and the bundle's, derived: the workspace's bundle holds one copy of the
  weights, so it shrinks by what one graph does);
- conversion error: the graph against the torch model with the same stored weights (the bound of
  verify_tflite, 1e-4), on LiteRT's CPU accelerator as stored (and, per-row integer weights, in the
  exact form the pipeline's CPU checks run: scripts/litert/cpu_graph.py), and on the GPU accelerator
  in every mode where
  the workspace's GPU checks run whole graphs (the tiny checkpoint), or the accelerator's refusal;
- the quantization's effect: the graph against stock float64 with the checkpoint's weights, and the
  lm_head's decisions (scripts/checks/quantization_effect.py); on held-out text, the decision figures
  (scripts/checks/decision_check.py: llama.cpp's KL-divergence statistics) on LiteRT's CPU, beside the
  torch-float16 floor (the GPU modes' decisions at the release's weights are verify_gpu's);
- against the fp32-stored graph's outputs: what the storage alone changes;
- speed: LiteRT CPU and torch eager medians on one record, the GPU accelerator's, and the CPU's rate
  against this machine's fp32 matmul peak (scripts/bench/report.py); the fp32 graph is timed again
  right after each variant, and the speed-up is of those two medians, taken under the same load.
On held-out text, the host tables too (host_tables.MEASURED, release.host_weights_precision): their bytes and
what they alone do to the decisions (stock float64 fed the embeddings they give, its logits through the
lm_head they give, against the truth). Then, where the workspace's graphs are fp32 or fp16, every graph
it releases is converted at the other
of the two and run on its reference record beside the workspace's file: how default `weights` was
chosen (docs/release.md, "Weights").
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch

from scripts.bench import litert_benchmark, report
from scripts.checkpoint import snapshot
from scripts.checks import (
    bundle_check,
    compare,
    decision_check,
    gpu_check,
    quantization_effect,
    record_text,
    tflite_check,
)
from scripts.checks.decision import DecisionFigures
from scripts.checks.quantization_effect import QuantizationEffect
from scripts.layers import kernel_form
from scripts.litert import export, gpu_accelerator, sections, tflite_file, weight_storage
from scripts.litert.cpu_graph import CpuGraph
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.pipeline.measure import Stopwatch, median_seconds, stack_fp32_bytes
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import host_tables, model_change, patch, row_graph
from scripts.qwen35.host import Host
from scripts.release import references

# (params.yaml `weights`, storage scheme): each precision through a DEQUANTIZE before each reader
# (weight_only), and int8 and int4 read by the FULLY_CONNECTED itself (dynamic: the pipeline's scheme
# for them, what the GPU accelerator reads; XNNPACK's dynamic kernels on the CPU), blockwise int4 among them
VARIANTS = (
    ("fp32", "weight_only"),
    ("fp16", "weight_only"),
    ("int8", "weight_only"),
    ("int8", "dynamic"),
    ("int4", "weight_only"),
    ("int4", "dynamic"),
    ("int4b32", "dynamic"),
)
# At real width (model.source synthetic) each variant is a 3.5 GB conversion and its runs: the forms the
# pipeline stores only (fp32 the speed baseline). The DEQUANTIZE forms of int8 and int4 (fp32's speed, the
# GPU refuses them) and blockwise int4 (the GPU aborts on it) are the tiny bench's to show.
REAL_WIDTH_VARIANTS = (("fp32", "weight_only"), ("fp16", "weight_only"), ("int8", "dynamic"), ("int4", "dynamic"))
BENCH_L = 64
REPEATS = 5
GPU_REPEATS = 3
RESULT = "weights"


def variant_name(weights: str, scheme: str) -> str:
    return weights if scheme == "weight_only" else f"{weights}_{scheme}"


@dataclasses.dataclass(frozen=True)
class GpuTake(Record):
    """What the GPU accelerator made of a graph in one mode: the refusal in its words, or compiled and
    whether whole; then either run (its worst error against torch, the median seconds of a run) or compiled
    section by section and not run (`run` False, the sections, the seconds compiling them)."""

    compiled: bool
    refused: str | None = optional()
    run: bool | None = optional()
    fully_accelerated: bool | None = optional()
    max_rel_vs_torch: float | None = optional()
    max_rel_per_position_vs_torch: float | None = optional()
    median_s: float | None = optional()
    sections: int | None = optional()
    compile_s: float | None = optional()


GpuModes = dict[str, GpuTake]
"""A GPU mode (gpu_accelerator.MODES) -> what the accelerator made of the graph in it."""


def gpu_figures(
    path: Path, records: dict[str, tuple[int, dict[str, torch.Tensor]]], expected: dict[str, torch.Tensor]
) -> GpuModes:
    """Each GPU mode on the graph: compiled alone, the worst error against torch over the records and the
    median seconds of a run; or the accelerator's refusal, in its words."""
    out = {}
    census = tflite_file.census(path)
    for mode in gpu_accelerator.MODES:
        try:
            compiled = gpu_accelerator.compile(path, mode, census)
        except ClefError as e:
            out[mode] = GpuTake(compiled=False, refused=str(e).split(": ", 1)[-1])
            continue
        try:
            run = compiled.signature(export.DEFAULT_SIGNATURE)
            rows = [
                compare.figures("vs_torch", run(**inputs)["hidden"][0, :n], expected[kind])
                for kind, (n, inputs) in records.items()
            ]
            timed = records[tflite_check.REFERENCE_KIND][1]
            out[mode] = GpuTake(
                compiled=True,
                fully_accelerated=compiled.fully_accelerated,
                max_rel_vs_torch=compare.worst(rows, "rel_vs_torch"),
                max_rel_per_position_vs_torch=compare.worst(rows, "rel_per_position_vs_torch"),
                median_s=median_seconds(lambda run=run, timed=timed: run(**timed), GPU_REPEATS),
            )
        finally:
            compiled.close()
    return out


def gpu_compiled(path: Path, max_bytes: int, census: dict) -> GpuModes:
    """Each GPU mode compiling the graph for the accelerator alone, section by section
    (scripts/litert/sections.py, as verify_gpu cuts it), none of it run: whether every section is fully
    accelerated, or the refusal in the accelerator's words. Where a software GPU would take hours to run
    a real-width graph in four precisions, this is what the accelerator takes of each."""
    graph = sections.SectionedGraph(path, max_bytes)
    out = {}
    try:
        parts = [s.path for name in graph.plans for s in graph.sections(name)]
        for mode in gpu_accelerator.MODES:
            run, clock = gpu_check.ModeRun(graph, mode, census), Stopwatch()
            try:
                for part in parts:
                    run.compile(part).close()
            except ClefError as e:
                out[mode] = GpuTake(compiled=False, refused=str(e).split(": ", 1)[-1])
                continue
            out[mode] = GpuTake(
                compiled=True,
                run=False,
                fully_accelerated=run.fully_accelerated,
                sections=len(parts),
                compile_s=clock.seconds(),
            )
    finally:
        graph.close()
    return out


@dataclasses.dataclass(frozen=True)
class Scored:
    """The decision windows every variant is scored on (scripts/checks/decision_check.py), their truth
    (stock float64 with the checkpoint's weights) and their graph inputs."""

    host: Host
    set: decision_check.ScoringSet
    truth: decision_check.DecisionTruth
    inputs: list[dict]

    def of(self, hidden: list[torch.Tensor]) -> DecisionFigures:
        return decision_check.figures(self.host, self.set, self.truth, hidden)


@dataclasses.dataclass(frozen=True)
class VariantConversion(Record):
    """The graph against the torch model with the same stored weights: the worst record, and each record's
    compare.figures."""

    max_rel_vs_torch: float
    max_rel_per_position_vs_torch: float
    rows: list[dict]

    @classmethod
    def of(cls, rows: list[dict]) -> VariantConversion:
        """The record of compare.figures("vs_torch", ...) rows: their worst of each figure, and the rows."""
        return cls(compare.worst(rows, "rel_vs_torch"), compare.worst(rows, "rel_per_position_vs_torch"), rows)


@dataclasses.dataclass(frozen=True)
class VsFp32Graph(Record):
    """The graph against the fp32-stored graph's outputs: what the storage alone changes."""

    max_rel: float
    max_rel_per_position: float
    rows: list[dict]


@dataclasses.dataclass(frozen=True)
class CpuSpeed(Record):
    """LiteRT's CPU accelerator and torch eager on one record: medians, the fp32 graph timed right after,
    and the graph's matmul rate against this machine's fp32 peak."""

    litert_median_s: float
    fp32_adjacent_median_s: float
    torch_median_s: float
    torch_over_litert: float
    matmul_gflops: float
    fraction_of_peak: float


@dataclasses.dataclass(frozen=True)
class Variant(Record):
    """One weights variant of the row graph: how its weights were stored, its size, conversion error, the
    quantization's effect, what storage alone changes (None for fp32 itself), CPU speed, the GPU's take."""

    weights: str
    scheme: str
    bytes: int
    stored: dict
    applied: dict
    convert_seconds: float
    census: dict
    conversion: VariantConversion
    quantization_effect: QuantizationEffect
    vs_fp32_graph: VsFp32Graph | None
    cpu: CpuSpeed
    gpu: GpuModes
    decision: DecisionFigures | None = optional()  # LiteRT's CPU accelerator, on held-out text
    # dynamic scheme: the CPU against the same model whose Linears read their input as XNNPACK's dynamic
    # kernels quantize it (scripts/layers/dynamic_activations.py): what is left is the CPU's own rounding
    cpu_arithmetic: VariantConversion | None = optional()
    # LiteRT's own litert-benchmark on the CPU accelerator, params.yaml `latency`'s runs and threads
    litert_benchmark: litert_benchmark.SignatureTiming | None = optional()
    # dynamic scheme, per row: the graph's exact form (each integer weight through a DEQUANTIZE:
    # scripts/litert/cpu_graph.py), what the pipeline's CPU checks hold to today's bounds
    exact_form: VariantConversion | None = optional()


def measure(
    ws: Path, snap: Path, form: str, variant: tuple[str, str], records: dict, truths: dict, base: dict, **how
) -> Variant:
    """One variant: convert, store, and measure (module doc); `base` holds the fp32 graph once that variant
    has run ({} before): its outputs, and its runner, timed again right after each variant so that the
    speed ratio is of two medians taken under the same load on the machine."""
    precision, scheme = variant
    host, peak, scratch, gpu, scored = how["host"], how["peak"], how["scratch"], how["gpu"], how["scored"]
    clock = Stopwatch()
    model, info, _ = patch.load(snap, form, progress=False, weights=precision)
    graph = row_graph.ClefRowPrefill(model, BENCH_L).eval()
    with torch.no_grad():
        expected = {kind: graph(**inputs)["hidden"][0, :n] for kind, (n, inputs) in records.items()}
        emulated = None
        if scheme == "dynamic":
            with model_change.changed(model, dynamic_activations=True):
                emulated = {kind: graph(**inputs)["hidden"][0, :n] for kind, (n, inputs) in records.items()}
    timed = records[tflite_check.REFERENCE_KIND][1]
    torch_s = statistics.median(tflite_check.torch_times(graph, timed, REPEATS))
    raw, path = scratch / f"{variant_name(*variant)}.raw", scratch / f"{variant_name(*variant)}.tflite"
    export.convert_row(model, host, BENCH_L, raw)
    del graph, model
    gc.collect()
    stored = weight_storage.store(raw, path, precision, scheme)
    scheme = stored.scheme
    raw.unlink()
    convert_s = clock.seconds()
    lite = CpuGraph(path, dynamic_kernels=True)  # as stored: the dynamic kernels are what is measured
    runner = lite.get_signature_runner()
    outputs = {kind: tflite_check.run(runner, inputs)[0, :n] for kind, (n, inputs) in records.items()}
    litert_s = statistics.median(tflite_check.litert_times(runner, timed, REPEATS))
    fp32_s = statistics.median(tflite_check.litert_times(base["runner"], timed, REPEATS)) if base else litert_s
    flops = sum(tflite_file.matmul_flops(path).values())
    census = tflite_file.census(path)
    timing = how["latency"]
    benchmarked = litert_benchmark.run(
        path, next(iter(sorted(census["signatures"]))), timing["runs"], timing["warmup_runs"], timing["threads"]
    )
    exact_form = None
    if scheme == "dynamic" and not params.parse_weights(precision).block:  # a DEQUANTIZE reads no blockwise weight
        exact = CpuGraph(path)
        exact_runner = exact.get_signature_runner()
        exact_form = VariantConversion.of(
            [
                {
                    "record": kind,
                    **compare.figures("vs_torch", tflite_check.run(exact_runner, inputs)[0, :n], expected[kind]),
                }
                for kind, (n, inputs) in records.items()
            ]
        )
        exact.close()
    conversion = [{"record": kind, **compare.figures("vs_torch", outputs[kind], expected[kind])} for kind in records]
    arithmetic = [
        {"record": kind, **compare.figures("vs_torch", outputs[kind], want)} for kind, want in (emulated or {}).items()
    ]
    effect = [quantization_effect.row(kind, n, outputs[kind], truths[kind], host) for kind, (n, _) in records.items()]
    storage_alone = [
        {"record": kind, **compare.figures("vs_fp32_graph", outputs[kind], want)}
        for kind, want in (base.get("outputs") or {}).items()
    ]
    row = Variant(
        weights=precision,
        scheme=scheme,
        bytes=path.stat().st_size,
        stored=stored.to_json(),
        applied=info["weights"].to_json(),
        convert_seconds=convert_s,
        census={k: v for k, v in census.items() if k in ("op_total", "ops", "dtypes")},
        conversion=VariantConversion.of(conversion),
        quantization_effect=quantization_effect.summary(effect),
        vs_fp32_graph=VsFp32Graph(
            max_rel=compare.worst(storage_alone, "rel_vs_fp32_graph"),
            max_rel_per_position=compare.worst(storage_alone, "rel_per_position_vs_fp32_graph"),
            rows=storage_alone,
        )
        if base
        else None,
        cpu=CpuSpeed(
            litert_median_s=litert_s,
            fp32_adjacent_median_s=fp32_s,  # the fp32 graph, timed right after
            torch_median_s=torch_s,
            torch_over_litert=torch_s / litert_s,
            matmul_gflops=flops / litert_s / 1e9,
            fraction_of_peak=flops / litert_s / 1e9 / peak.gflops,
        ),
        gpu=gpu_figures(path, records, expected) if gpu else gpu_compiled(path, how["section_bytes"], census),
        decision=scored.of([tflite_check.run(runner, r)[0] for r in scored.inputs]) if scored else None,
        cpu_arithmetic=VariantConversion.of(arithmetic) if arithmetic else None,
        exact_form=exact_form,
        litert_benchmark=benchmarked,
    )
    if not base and precision == "fp32":
        base.update(outputs=outputs, graph=lite, runner=runner)  # closed by main, after every variant
    else:
        lite.close()
    path.unlink()
    print(
        f"weights-bench {variant_name(*variant)}: {row.bytes} bytes, conversion error "
        f"{compare.shown(row.conversion.max_rel_vs_torch)}, top-1 agreement "
        f"{row.quantization_effect.min_top1_agreement:.3f}, "
        + (f"decision {decision_check.shown(row.decision)}, " if row.decision else "")
        + f"LiteRT CPU {litert_s * 1e3:.1f} ms "
        f"({row.cpu.fraction_of_peak:.2f} of peak)",
        flush=True,
    )
    return row


@dataclasses.dataclass(frozen=True)
class ReferenceRecords(Record):
    """Every graph the workspace releases at the other of fp32 / fp16, on its reference record beside the
    workspace's file: per graph its bytes at both and bundle_check.difference, and the largest difference."""

    workspace_weights: str
    converted_at: str
    what: str
    rows: list[dict]
    max_rel: float


def other_precision(snap: Path, form: str, ws: Path, p: dict, host: Host, scratch: Path) -> ReferenceRecords | None:
    """Every graph the workspace releases converted at the other of fp32 / fp16 and run on its reference
    record beside the workspace's file: identical outputs or the difference, per graph."""
    have = p["weights"]
    if have not in ("fp32", "fp16"):
        return None
    other = "fp16" if have == "fp32" else "fp32"
    model, _, _ = patch.load(snap, form, progress=False, weights=other)
    rows = []
    for g in bundle_check.planned(p["lengths"], p["pairs"]):
        mine = ws / g.path
        record = references.load_reference(ws / layout.REFERENCES, layout.reference_path(g.path).name)
        raw, path = scratch / f"{g.name}.raw", scratch / f"{g.name}.tflite"
        if g.kind == "row":
            export.convert_row(model, host, g.shape["L"], raw)
        else:
            export.convert_pair(model, host, g.shape["P"], g.shape["S"], raw)
        weight_storage.store(raw, path, other)
        raw.unlink()
        _, theirs = bundle_check.run_record(references.interpreter_signature(CpuGraph(path)), g.kind, record)
        _, ours = bundle_check.run_record(references.interpreter_signature(CpuGraph(mine)), g.kind, record)
        fp32, fp16 = (ours, theirs) if have == "fp32" else (theirs, ours)
        rows.append(
            {
                "graph": g.name,
                "bytes": {have: mine.stat().st_size, other: path.stat().st_size},
                **bundle_check.difference(fp16, fp32).to_json(),
            }
        )
        path.unlink()
    del model
    gc.collect()
    return ReferenceRecords(
        workspace_weights=have,
        converted_at=other,
        what="every graph's reference record through its fp16-stored and fp32-stored files, CPU accelerator; "
        "max_rel: the fp16 file's outputs against the fp32 file's (compare.rel)",
        rows=rows,
        max_rel=compare.worst(rows, "max_rel"),
    )


@dataclasses.dataclass(frozen=True)
class DerivedBundle(Record):
    """The workspace's bundle at each precision, derived from the graphs' bytes (not built)."""

    workspace_bundle_bytes: int
    workspace_weights: str
    what: str
    bytes: dict[str, int]


@dataclasses.dataclass(frozen=True)
class WeightsBench(Record):
    """<workspace>/results/weights.json: every weights variant of the L=64 row graph side by side, and every
    released graph at the other of fp32 / fp16."""

    workspace: str
    source: str
    form: str
    L: int
    records: dict[str, int]
    measured_utc: str
    machine: report.Machine
    matmul_peak: report.MatmulPeak
    variants: dict[str, Variant]
    bytes_over_fp32: dict[str, float]
    litert_speedup_over_fp32: dict[str, float]
    bundle: DerivedBundle | None
    reference_records: ReferenceRecords | None
    seconds: float
    scored_tokens: int | None = optional()  # the decision windows' tokens (held-out text; None: random ids)
    decision_floor: DecisionFigures | None = optional()  # stock transformers in torch float16 on them
    host_tables: dict[str, HostTables] | None = optional()  # by release.host_weights_precision (held-out text)


@dataclasses.dataclass(frozen=True)
class HostTables(Record):
    """The host tables at one release.host_weights_precision: their bytes (both, codes and scales) and the
    decisions of stock float64 fed the embeddings they give and read through the lm_head they give, against
    the truth (the checkpoint's tables): what the host tables alone do to the decisions."""

    bytes: int
    decision: DecisionFigures


def host_tables_effect(stock, host: Host, scored: Scored, precision: str) -> HostTables:
    """HostTables at `precision` (`stock`: gpu_check.StockReferences of the unquantized model)."""
    held = host_tables.at(host, precision)
    hidden = [stock.exact(r["embeds"]) for r in scored.set.records(held)]
    size = sum(host_tables.stored_bytes(tuple(t.shape), precision) for t in (host.embed_tokens, host.lm_head))
    return HostTables(size, decision_check.figures(host, scored.set, scored.truth, hidden, graph_host=held))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", type=Path, default=Path("."))
    ap.add_argument("--skip-reference-records", action="store_true", help="not the every-graph comparison")
    a = ap.parse_args()
    ws = a.workspace
    if not (ws / "results/snapshot.json").is_file():
        raise ClefError(f"no pipeline run in {ws}: run make release (or make real-width) first")
    p = params.load(
        ["form", "lengths", "pairs", "model.source", "verify_gpu", "decision", "latency"], path=ws / "params.yaml"
    )
    p["weights"] = p.get("weights", "fp32")  # a workspace from before params.yaml had `weights` stored fp32
    form = str(kernel_form.parse(p["form"]))
    snap = snapshot.verify(snapshot.load_record(ws / "results/snapshot.json"), root=ws)
    host = Host(snap)
    text = record_text.for_source(p["model"]["source"], host)
    records = tflite_check.row_records(host, BENCH_L, text)
    gpu = params.gpu_depth(p["verify_gpu"]["layers"], p["model"]["source"]) == "all"
    model, _, _ = patch.load(snap, form, progress=False)
    truths = quantization_effect.truths(model, records)
    scored = held_tables = None
    if text.kind == record_text.HELD_OUT_TEXT:
        windows = decision_check.scoring_set(text, BENCH_L, p["decision"]["scored_tokens"])
        stock = gpu_check.StockReferences(model)
        truth = decision_check.truth(stock, host, windows)
        scored = Scored(host, windows, truth, windows.records(host))
        held_tables = {hp: host_tables_effect(stock, host, scored, hp) for hp in host_tables.MEASURED}
        for hp, t in held_tables.items():
            print(f"weights-bench host tables {hp}: {t.bytes} bytes, decision {decision_check.shown(t.decision)}")
        del stock
    del model
    gc.collect()
    peak = report.matmul_peak()
    base: dict = {}
    clock = Stopwatch()
    with tempfile.TemporaryDirectory(dir=ws / "artifacts", prefix=".weights-bench.") as tmp:
        scratch = Path(tmp)
        fp32_stack = stack_fp32_bytes(str(ws))
        if not gpu and fp32_stack is None:
            raise ClefError(f"no {ws / layout.result_path('stack')}: the GPU compile's sections are sized by it")
        section_bytes = None if gpu else gpu_check.section_bytes(p["verify_gpu"], fp32_stack, BENCH_L)
        how = {"host": host, "peak": peak, "scratch": scratch, "gpu": gpu, "section_bytes": section_bytes}
        how["latency"] = {k: int(v) for k, v in p["latency"].items()}
        how["scored"] = scored
        try:
            variants = REAL_WIDTH_VARIANTS if p["model"]["source"] == "synthetic" else VARIANTS
            rows = {variant_name(*v): measure(ws, snap, form, v, records, truths, base, **how) for v in variants}
        finally:
            if base:
                base["graph"].close()
        others = None if a.skip_reference_records else other_precision(snap, form, ws, p, host, scratch)
    bundle_record = ws / layout.result_path("bundle")
    bundle = layout.read_record(bundle_record, "bundle") if bundle_record.is_file() else None
    fp32_bytes = rows["fp32"].bytes
    derived = None
    if bundle is not None:
        have = rows[variant_name(p["weights"], weight_storage.pipeline_scheme(p["weights"]))].bytes
        derived = DerivedBundle(
            workspace_bundle_bytes=bundle["sharing"]["bytes"],
            workspace_weights=p["weights"],
            what="the workspace's bundle less what one graph's weights save at each precision (the bundle "
            "stores one copy of the weights): derived, not built",
            bytes={name: bundle["sharing"]["bytes"] - have + r.bytes for name, r in rows.items()},
        )
    doc = WeightsBench(
        workspace=str(ws),
        source=p["model"]["source"],
        form=form,
        L=BENCH_L,
        records={kind: n for kind, (n, _) in records.items()},
        measured_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=report.machine(),
        matmul_peak=peak,
        variants=rows,
        bytes_over_fp32={name: r.bytes / fp32_bytes for name, r in rows.items()},
        litert_speedup_over_fp32={
            name: r.cpu.fp32_adjacent_median_s / r.cpu.litert_median_s for name, r in rows.items()
        },
        bundle=derived,
        reference_records=others,
        seconds=clock.seconds(),
        scored_tokens=scored.set.scored_tokens if scored else None,
        decision_floor=decision_check.floor(host, scored.set, scored.truth) if scored else None,
        host_tables=held_tables,
    )
    atomic.write_json(ws / layout.result_path(RESULT), doc.to_json())
    print(
        "weights-bench: bytes over fp32 "
        + ", ".join(f"{k} {v:.3f}" for k, v in doc.bytes_over_fp32.items())
        + "; LiteRT CPU speedup over fp32 "
        + ", ".join(f"{k} {v:.2f}x" for k, v in doc.litert_speedup_over_fp32.items())
        + (f"; fp16 vs fp32 files on every reference record: max rel {compare.shown(others.max_rel)}" if others else "")
        + f" -> {ws / layout.result_path(RESULT)}"
    )


if __name__ == "__main__":
    run_stage(main, budget=False)
