"""results/bench.json: where time and memory go at toy and at real width, and how close the real-width
row graph comes to this machine's fp32 matmul peak.

- stages: wall time and peak RSS of every stage, read from results/runtime/ of the default (tiny)
  workspace and of the real-width one (make real-width).
- latency: LiteRT interpreter vs torch eager per L, from each workspace's verify_tflite records.
- gpu, gpu_worst: verify_gpu's figures per graph and mode (fp32, fp16, mixed), and each half mode's
  worst ratio to the torch-float16 floor, from each workspace's results/gpu/ (see `gpu_figures`).
- efficiency, measured here in one process, one after the other on an otherwise idle machine: the fp32
  matmul peak (torch.mm of two PEAK_N x PEAK_N matrices), then the real-width L=64 row graph in the
  interpreter; the graph's multiply-accumulate FLOPs are counted from the file. Target: >= 0.5 of peak.
- clef_flash: the real model's needs per stage, extrapolated from the two runs (see `extrapolate`).
Medians of REPEATS runs after one warm-up; figures, never assertions (these machines are noisy).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import torch

from scripts.checkpoint import snapshot
from scripts.checks import compare, record_text, tflite_check
from scripts.litert import tflite_file
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.pipeline.measure import Runtime, median_seconds
from scripts.pipeline.records import Record, optional
from scripts.release import builder

PEAK_N = 4096  # 137 GFLOP per product: ~1 s here, long enough to time, the size of clef-flash's hidden
REPEATS = 5
TARGET_FRACTION_OF_PEAK = 0.5
CLEF_FLASH_LAYERS = 32  # (3 GatedDeltaNet + 1 attention) x 8; the real-width run has one such block
# Qwen3.5-9B's vocabulary: the synthetic checkpoint keeps the tiny tokenizer's 320 tokens, so clef-flash's host
# tables (embed_tokens and lm_head, [V, hidden] each) are extrapolated at this V, not copied from the run
CLEF_FLASH_VOCAB = 248320
CLEF_FLASH_SNAPSHOT_BYTES = 19.3e9  # bf16 on disk, vision and MTP included (the hub's file list)


@dataclasses.dataclass(frozen=True)
class MatmulPeak(Record):
    """This machine's fp32 matmul rate: torch.mm of two n x n matrices, median seconds, GFLOP/s."""

    n: int
    median_s: float
    gflops: float
    threads: int


@dataclasses.dataclass(frozen=True)
class GraphRate(Record):
    """A row graph in the interpreter: its median time, multiply-accumulate FLOPs per op kind, GFLOP/s."""

    file: str
    bytes: int
    L: int
    median_s: float
    matmul_flops: dict[str, int]
    gflops: float


def matmul_peak(n: int = PEAK_N) -> MatmulPeak:
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = median_seconds(lambda: torch.mm(a, b), REPEATS)
    return MatmulPeak(n=n, median_s=seconds, gflops=2 * n**3 / seconds / 1e9, threads=torch.get_num_threads())


def graph_rate(ws: Path, length: int) -> GraphRate:
    """The row graph of `ws` at `length` in the interpreter: median time, counted FLOPs, GFLOP/s."""
    from scripts.qwen35.host import Host

    path = ws / layout.row_path(length)
    if not path.is_file():
        raise ClefError(f"no {path}: run make real-width first")
    snap = snapshot.verify(snapshot.load_record(ws / "results/snapshot.json"), root=ws)
    host = Host(snap)
    vocab = snapshot.text_config(snap)["vocab_size"]
    inputs = host.record(record_text.random_ids(length, vocab, length), length)
    runner = tflite_check.interpreter(path).get_signature_runner()
    seconds = median_seconds(lambda: tflite_check.run(runner, inputs), REPEATS)
    flops = tflite_file.matmul_flops(path)
    total = sum(flops.values())
    return GraphRate(
        file=str(path),
        bytes=path.stat().st_size,
        L=length,
        median_s=seconds,
        matmul_flops=flops,
        gflops=total / seconds / 1e9,
    )


def pipeline_name(record: str) -> str:
    """A runtime record's name (measure.stage_name: the module and its arguments) -> the pipeline's name
    for the stage: one module, verify_gpu, runs two stages, verify_gpu_row@L and verify_gpu_pair@P_S."""
    base, _, args = record.partition("@")
    if base == "verify_gpu" and args:
        return f"verify_gpu_{'pair' if '_' in args else 'row'}@{args}"
    return record


@dataclasses.dataclass(frozen=True)
class StageFigures(Record):
    """One stage's runtime record as the bench carries it, in GiB; a figure the record lacks (made before
    it was kept, or a stage without a memory budget or an accelerator) is left out."""

    seconds: float
    peak_rss_gib: float
    finished_utc: str
    startup_seconds: float | None = optional()
    peak_anon_gib: float | None = optional()
    budget_gib: float | None = optional()
    within_budget: bool | None = optional()
    accelerator_seconds: float | None = optional()
    parts: dict[str, float] | None = optional()  # seconds by part (scripts/pipeline/profile.py)


def stage_records(ws: Path) -> dict[str, StageFigures]:
    """{pipeline's stage name: its StageFigures}, from the runtime records in `ws`."""
    runtime = ws / layout.RUNTIME
    runs = {pipeline_name(p.stem): Runtime.read(p) for p in sorted(runtime.glob("*.json"))} if runtime.is_dir() else {}
    budgets = {name: r.memory_budget for name, r in runs.items()}
    return {
        name: StageFigures(
            seconds=r.seconds,
            startup_seconds=r.startup_seconds,
            peak_rss_gib=r.peak_rss_bytes / 2**30,
            peak_anon_gib=r.peak_anon_bytes / 2**30 if r.peak_anon_bytes is not None else None,
            finished_utc=r.finished_utc,
            budget_gib=budgets[name].limit_bytes / 2**30 if budgets[name] is not None else None,
            within_budget=budgets[name].within if budgets[name] is not None else None,
            accelerator_seconds=accelerator_seconds(ws, name),
            parts=r.parts,
        )
        for name, r in runs.items()
    }


def accelerator_seconds(ws: Path, stage: str) -> float | None:
    """A verify_gpu stage's seconds inside LiteRT's GPU accelerator (compiling and running, both modes),
    from its record; None for other stages and records made before it was kept."""
    base, _, args = stage.partition("@")
    if base not in GPU_STAGES:
        return None
    sizes = [int(a) for a in args.split("_")]
    name = layout.gpu_name(sizes[0]) if base == "verify_gpu_row" else layout.gpu_name(prefix=sizes[0], suffix=sizes[1])
    path = ws / layout.gpu_result_path(name)
    doc = json.loads(path.read_text()) if path.is_file() else {}
    return sum(doc["accelerator_seconds"].values()) if "accelerator_seconds" in doc else None


def tflite_records(ws: Path) -> list[dict]:
    """verify_tflite's records in `ws` (results/tflite_L*.json) as read, in file name order."""
    return [json.loads(path.read_text()) for path in sorted((ws / layout.RESULTS).glob("tflite_L*.json"))]


def ops_per_gdn_layer(ws: Path) -> dict[str, int]:
    """{L: the most ops any GatedDeltaNet has in the row graph of L}, from verify_tflite's census."""
    return {str(doc["L"]): max(doc["census"]["ops_per_gdn_layer"].values()) for doc in tflite_records(ws)}


@dataclasses.dataclass(frozen=True)
class RowLatency(Record):
    """One row graph's verify_tflite record as the bench carries it: interpreter and torch eager times."""

    litert_ms: float
    torch_ms: float
    torch_over_litert: float
    bytes: int
    max_rel_vs_torch: float
    passed: bool


def latency(ws: Path) -> dict[str, RowLatency]:
    """{L: that row graph's RowLatency}, from each of verify_tflite's records in `ws`."""
    return {
        str(doc["L"]): RowLatency(
            litert_ms=1e3 * doc["latency"]["litert_median_s"],
            torch_ms=1e3 * doc["latency"]["torch_median_s"],
            torch_over_litert=doc["latency"]["torch_over_litert"],
            bytes=doc["bytes"],
            max_rel_vs_torch=doc["max_rel_vs_torch"],
            passed=doc["passed"],
        )
        for doc in tflite_records(ws)
    }


GPU_HALF_MODES = ("fp16", "mixed")  # scripts/checks/gpu_check.HALF_MODES, held against float64 and the floor
GPU_FP32_KEYS = ("max_rel_vs_torch", "max_rel_per_position_vs_torch")
GPU_HALF_KEYS = (
    "max_rel_vs_f64",
    "max_rel_per_position_vs_f64",
    "floor_max_rel_vs_f64",
    "over_floor",
    "over_floor_per_position",
    "within_target",
)


@dataclasses.dataclass(frozen=True)
class Fp32Figures(Record):
    """A graph on the GPU accelerator in fp32 mode: taken whole, and its error against torch."""

    fully_accelerated: bool | None
    max_rel_vs_torch: float | None
    max_rel_per_position_vs_torch: float | None


@dataclasses.dataclass(frozen=True)
class HalfFigures(Record):
    """A graph on the GPU accelerator in a half mode (GPU_HALF_MODES): taken whole, its error against
    float64, the torch-float16 floor's, its ratio to the floor and whether that is within the target."""

    fully_accelerated: bool | None
    max_rel_vs_f64: float | None
    max_rel_per_position_vs_f64: float | None
    floor_max_rel_vs_f64: float | None
    over_floor: float | None
    over_floor_per_position: float | None
    within_target: bool | None


@dataclasses.dataclass(frozen=True)
class GraphGpu(Record):
    """One verify_gpu record: the layers it checked of the graph's, and each mode's figures (no mixed in a
    record made before verify_gpu ran it)."""

    layers_checked: int | None
    layers: int | None
    fp32: Fp32Figures
    fp16: HalfFigures
    mixed: HalfFigures | None = optional()


@dataclasses.dataclass(frozen=True)
class WorstOverFloor(Record):
    """A half mode's worst ratios to the floor over the graphs (NaN wins; None where no graph has one)."""

    over_floor: float | None
    over_floor_per_position: float | None


@dataclasses.dataclass(frozen=True)
class WorkspaceGpu(Record):
    """verify_gpu's figures of a workspace: per record (results/gpu/<name>.json), and the worst per half mode."""

    gpu: dict[str, GraphGpu]
    gpu_worst: dict[str, WorstOverFloor]


def gpu_figures(ws: Path) -> WorkspaceGpu:
    """verify_gpu's records in `ws` (results/gpu/*.json) -> per record its layers_checked, layers, and per
    mode: fully_accelerated, fp32's GPU_FP32_KEYS, each half mode's GPU_HALF_KEYS; and per half mode the
    worst over_floor and over_floor_per_position over the graphs. A record without `modes` (made before
    verify_gpu ran mixed) gives fp32 and fp16 from its flat keys (no per-position ratio, no mixed)."""
    graphs = {}
    folder = ws / layout.GPU
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        doc = json.loads(path.read_text())
        modes = doc.get("modes")
        if modes is None:
            accelerated = doc.get("fully_accelerated")
            modes = {
                "fp32": {k: doc.get(f"fp32_{k}") for k in GPU_FP32_KEYS},
                "fp16": {
                    "max_rel_vs_f64": doc.get("fp16_max_rel_vs_f64"),
                    "max_rel_per_position_vs_f64": doc.get("fp16_max_rel_per_position_vs_f64"),
                    "floor_max_rel_vs_f64": doc.get("floor_max_rel_vs_f64"),
                    "over_floor": doc.get("fp16_over_floor"),
                    "within_target": doc.get("fp16_within_target"),
                },
            }
            for figures in modes.values():
                figures["fully_accelerated"] = accelerated
        graphs[path.stem] = GraphGpu(
            layers_checked=doc.get("layers_checked"),
            layers=doc.get("layers"),
            **{
                mode: (HalfFigures if mode in GPU_HALF_MODES else Fp32Figures)(
                    fully_accelerated=figures.get("fully_accelerated"),
                    **{k: figures.get(k) for k in (GPU_HALF_KEYS if mode in GPU_HALF_MODES else GPU_FP32_KEYS)},
                )
                for mode, figures in modes.items()
            },
        )
    worst = {
        mode: WorstOverFloor(
            **{
                k: compare.largest(getattr(getattr(g, mode), k) for g in graphs.values() if getattr(g, mode))
                for k in ("over_floor", "over_floor_per_position")
            }
        )
        for mode in GPU_HALF_MODES
    }
    return WorkspaceGpu(gpu=graphs, gpu_worst=worst)


def commit(ws: Path) -> str | None:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ws, capture_output=True, text=True)
    return done.stdout.strip() or None


def pipeline_stages(ws: Path) -> list[str]:
    """Every stage of the workspace's pipeline, foreach stages by their instance names (dvc stage list)."""
    import subprocess

    done = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=ws, capture_output=True, text=True)
    pairs = params.read(ws / "params.yaml").get("pairs") or []
    out = []
    for name in (line.strip() for line in done.stdout.splitlines() if line.strip()):
        base, _, index = name.partition("@")
        if base in PER_PAIR and index.isdigit():  # dvc names a pair by its index, the stage by its P and S
            pair = pairs[int(index)]
            name = f"{base}@{pair['prefix']}_{pair['suffix']}"
        out.append(name)
    return out


@dataclasses.dataclass(frozen=True)
class BundleFigures(Record):
    """The figures the bench carries of the bundle stage's record: sizes, memory, whether it passed."""

    bytes: int
    constant_bytes: int
    part_constant_bytes: int
    largest_graph_bytes: int
    bytes_over_graph: float
    memory: dict
    passed: bool


def bundle_figures(ws: Path) -> BundleFigures | None:
    """The bundle stage's record in `ws` (results/bundle.json), the figures the bench carries; None
    for a workspace built before the stage existed."""
    path = ws / layout.result_path("bundle")
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return BundleFigures(
        bytes=doc["sharing"]["bytes"],
        constant_bytes=doc["sharing"]["constant_bytes"],
        part_constant_bytes=doc["sharing"]["part_constant_bytes"],
        largest_graph_bytes=doc["largest_graph"]["bytes"],
        bytes_over_graph=doc["bytes_over_graph"],
        memory=doc["memory"],
        passed=doc["passed"],
    )


@dataclasses.dataclass(frozen=True)
class VariantGpu(Record):
    """What the GPU accelerator made of a weights variant in one mode (None where the bench does not say)."""

    compiled: bool | None
    run: bool | None
    fully_accelerated: bool | None
    median_s: float | None
    refused: str | None


@dataclasses.dataclass(frozen=True)
class VariantFigures(Record):
    """One weights variant as the bench carries it: bytes, conversion error, effect on decisions, CPU speed
    and the GPU's take per mode (None where the weights bench has none)."""

    bytes: int
    conversion_max_rel: float
    conversion_max_rel_per_position: float
    min_top1_agreement: float
    min_top5_agreement: float
    max_mean_kl: float
    fraction_of_peak: float
    litert_median_s: float
    torch_median_s: float
    gpu: dict[str, VariantGpu] | None
    exact_form_max_rel: float | None = optional()  # per-row integer weights: the CPU checks' exact form
    litert_benchmark_median_ms: float | None = optional()  # litert-benchmark on the CPU accelerator


@dataclasses.dataclass(frozen=True)
class WeightsFigures(Record):
    """The weights bench's record as the bench carries it: per variant its figures, the ratios to fp32, the
    derived bundle's bytes and the fp16-vs-fp32 files' largest difference (None where not measured)."""

    L: int
    measured_utc: str
    bytes_over_fp32: dict[str, float]
    litert_speedup_over_fp32: dict[str, float]
    bundle_bytes: dict[str, int] | None
    reference_records_max_rel: float | None
    variants: dict[str, VariantFigures]


def weights_figures(ws: Path) -> WeightsFigures | None:
    """The weights bench's record in `ws` (results/weights.json, scripts/bench/weights_bench.py): per
    variant its bytes, conversion error, effect on decisions, CPU speed and GPU acceleration; None
    where it has not run. Read as JSON, not as weights_bench.WeightsBench (which imports this module):
    a record from an older bench, without the derived bundle or the reference records, is carried too."""
    path = ws / layout.result_path("weights")
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return WeightsFigures(
        L=doc["L"],
        measured_utc=doc["measured_utc"],
        bytes_over_fp32=doc["bytes_over_fp32"],
        litert_speedup_over_fp32=doc["litert_speedup_over_fp32"],
        bundle_bytes=(doc.get("bundle") or {}).get("bytes"),
        reference_records_max_rel=(doc.get("reference_records") or {}).get("max_rel"),
        variants={
            name: VariantFigures(
                bytes=v["bytes"],
                conversion_max_rel=v["conversion"]["max_rel_vs_torch"],
                conversion_max_rel_per_position=v["conversion"]["max_rel_per_position_vs_torch"],
                min_top1_agreement=v["quantization_effect"]["min_top1_agreement"],
                min_top5_agreement=v["quantization_effect"]["min_top5_agreement"],
                max_mean_kl=v["quantization_effect"]["max_mean_kl"],
                fraction_of_peak=v["cpu"]["fraction_of_peak"],
                litert_median_s=v["cpu"]["litert_median_s"],
                torch_median_s=v["cpu"]["torch_median_s"],
                exact_form_max_rel=(v.get("exact_form") or {}).get("max_rel_vs_torch"),
                litert_benchmark_median_ms=(v.get("litert_benchmark") or {}).get("median_ms"),
                gpu={
                    mode: VariantGpu(
                        **{k: g.get(k) for k in ("compiled", "run", "fully_accelerated", "median_s", "refused")}
                    )
                    for mode, g in (v["gpu"] or {}).items()
                }
                or None,
            )
            for name, v in doc["variants"].items()
        },
    )


@dataclasses.dataclass(frozen=True)
class Workspace(Record):
    """One workspace's run as the bench carries it: sizes, the bundle's and the weights bench's figures, each
    stage's time and memory, latency per L, verify_gpu's figures (`gpu`, `gpu_worst`), the stages that did
    not finish (failed, or skipped after a failure) and the params that shape the run."""

    path: str
    commit: str | None
    graph_bytes: int
    tarball_bytes: int
    release_bytes: int
    bundle: BundleFigures | None
    weights: WeightsFigures | None
    layers: int | None
    fp32_bytes: int | None
    stages: dict[str, StageFigures]
    latency: dict[str, RowLatency]
    stack_rss_budget: dict | None
    stack_peak_rss_bytes: int | None
    ops_per_gdn_layer: dict[str, int]
    gpu: dict[str, GraphGpu]
    gpu_worst: dict[str, WorstOverFloor]
    stages_not_finished: list[str]
    params: dict
    host_tables: HostFiles | None = optional()


@dataclasses.dataclass(frozen=True)
class HostFiles(Record):
    """The release's host tables as built: the included file's bytes and each table's [V, H] (the
    manifest's `host`), so the release can be extrapolated at each release.host_weights_precision."""

    file_bytes: int
    shapes: dict[str, list[int]]


def host_files(ws: Path) -> HostFiles | None:
    path = ws / layout.RELEASE / "manifest.json"
    if not path.is_file():
        return None
    host = json.loads(path.read_text()).get("host") or {}
    held = ws / layout.RELEASE / host["weights_file"] if host.get("weights_file") else None
    if held is None or not held.is_file():
        return None
    return HostFiles(held.stat().st_size, {role: t["shape"] for role, t in host["tensors"].items()})


def workspace(ws: Path) -> Workspace:
    stack = ws / layout.result_path("stack")
    s = json.loads(stack.read_text()) if stack.is_file() else {}
    graphs = sorted((ws / layout.ROWS).glob("*.tflite")) + sorted((ws / layout.PAIRS).glob("*.tflite"))
    stages = stage_records(ws)
    gpu = gpu_figures(ws)
    return Workspace(
        path=str(ws),
        commit=commit(ws),
        graph_bytes=sum(g.stat().st_size for g in graphs),
        tarball_bytes=sum(t.stat().st_size for t in (ws / layout.DIST).glob("*" + builder.TARBALL_SUFFIX)),
        release_bytes=sum(f.stat().st_size for f in (ws / layout.RELEASE).rglob("*") if f.is_file()),
        bundle=bundle_figures(ws),
        weights=weights_figures(ws),
        layers=s.get("layers"),
        fp32_bytes=s.get("fp32_bytes"),
        stages=stages,
        latency=latency(ws),
        stack_rss_budget=s.get("rss_budget"),
        stack_peak_rss_bytes=s.get("peak_rss_bytes"),
        ops_per_gdn_layer=ops_per_gdn_layer(ws),
        gpu=gpu.gpu,
        gpu_worst=gpu.gpu_worst,
        stages_not_finished=[n for n in pipeline_stages(ws) if n not in stages],
        params={
            k: v
            for k, v in params.read(ws / "params.yaml").items()
            if k in ("lengths", "pairs", "memory", "verify_gpu", "model", "release", "weights")
        },
        host_tables=host_files(ws),
    )


# Stages whose work does not grow with the layer count: set by the widths and params (the kernel), or
# done on the first block only (the stock-vs-form conversion benchmark): clef-flash costs what the
# real-width run measured.
AS_MEASURED = ("verify_kernel", "kernel_bench", "export_stock", "export_bench")
PER_LENGTH = ("export", "verify_tflite", "verify_gpu_row")  # one stage per L
PER_PAIR = ("export_pair", "verify_pair", "verify_gpu_pair")  # one stage per pair, sized by P + S
BY_LENGTHS = ("verify_model",)  # one stage over every L: its work grows with the sum of the lengths
BY_GRAPHS = ("bundle", "release")  # reads every graph (the release: with release.layout files)
GPU_STAGES = ("verify_gpu_row", "verify_gpu_pair")  # on this machine, the software GPU (lavapipe): CPU-bound


def stage_size(name: str) -> tuple[str, int | None]:
    """ "export@64" -> ("export", 64); "verify_pair@256_64" -> ("verify_pair", 320); "stack" -> ("stack", None)."""
    base, _, args = name.partition("@")
    return base, sum(int(a) for a in args.split("_")) if args else None


UNEXTRAPOLATED = (
    "no tiny run of some real-width stages in results/runtime/, so no clef-flash extrapolation for them: "
    "run make release, then make bench"
)


@dataclasses.dataclass(frozen=True)
class StageNeeds(Record):
    """One stage's extrapolated needs on clef-flash: seconds, the accelerator's share where the real-width
    record kept it, and each memory figure the two runs both have, with its 8x `_upper` bound (none for an
    AS_MEASURED stage)."""

    seconds: float
    accelerator_seconds: float | None = optional()
    parts: dict[str, float] | None = optional()  # the seconds by part, scaled as the stage's
    peak_rss_gib: float | None = optional()
    peak_anon_gib: float | None = optional()
    peak_rss_gib_upper: float | None = optional()
    peak_anon_gib_upper: float | None = optional()


@dataclasses.dataclass(frozen=True)
class ClefFlash(Record):
    """clef-flash's needs extrapolated from the two runs (extrapolate), and the default params' pipeline on
    it (default_pipeline, set once the needs are known); memory_budget_gib where the tiny run's params
    have a memory budget."""

    blocks: int | None
    stages: dict[str, StageNeeds]
    without_tiny_run: list[str]
    row_graph_bytes_per_L: int | None
    bundle_bytes: int | None
    release_bytes: int | None
    release_bytes_by_weights: dict[str, int] | None
    snapshot_bytes: float
    fp32_stack_bytes: float | None
    memory_budget_gib: float | None = optional()
    default_pipeline: DefaultPipeline | None = optional()
    # release_bytes_by_weights with the host tables at each release.host_weights_precision instead
    release_bytes_by_weights_and_host: dict[str, dict[str, int]] | None = optional()


def extrapolate(tiny: dict, real: dict) -> ClefFlash:
    """clef-flash's needs per stage, from the real-width run (one of clef-flash's 8 blocks of 3
    GatedDeltaNet + 1 attention layers) and the tiny run (the same code with ~no weights), each as
    bench.json holds a Workspace (its to_json).
    - peak RSS and peak anonymous memory: what a stage holds above the tiny run's (the runtime) is
      weights up to one copy of the real-width stack, which grows 8x, and beyond that per-layer work
      (one layer converted to float64, activations at the same L), which does not: the real-width
      figure + 7 x the first part. `*_upper` scales all of it 8x, an upper bound;
    - time: the stage's start-up (process start to its main(): imports, the same at any depth) + 8 x
      the rest, an upper bound (the rest's fixed work, loading the interpreter, is scaled too); 8 x
      all of it for a record made before start-up was kept;
    - AS_MEASURED stages: as measured at real width, and so the time of a GPU stage that runs the first
      block only (verify_gpu.layers: block): it loads, references and runs that block at any depth."""
    blocks = CLEF_FLASH_LAYERS // real["layers"] if real.get("layers") else None
    real_params = real.get("params") or {}
    gpu_block = (
        params.gpu_depth(
            (real_params.get("verify_gpu") or {}).get("layers", "block"),
            (real_params.get("model") or {}).get("source", "synthetic"),
        )
        == "block"
    )
    stack_gib = (real.get("fp32_bytes") or 0) / 2**30
    out = {}
    for name, r in real["stages"].items():
        t = tiny["stages"].get(name)
        if t is None or blocks is None:
            continue
        memory = [k for k in ("peak_rss_gib", "peak_anon_gib") if k in r and k in t]
        if stage_size(name)[0] in AS_MEASURED:
            out[name] = StageNeeds(seconds=r["seconds"], parts=r.get("parts"), **{k: r[k] for k in memory})
        else:
            times = 1 if gpu_block and stage_size(name)[0] in GPU_STAGES else blocks
            startup = r.get("startup_seconds", 0.0)
            out[name] = StageNeeds(
                seconds=startup + times * (r["seconds"] - startup),
                accelerator_seconds=times * r["accelerator_seconds"] if "accelerator_seconds" in r else None,
                # every part is inside main(), after start-up
                parts={k: times * v for k, v in r["parts"].items()} if r.get("parts") is not None else None,
                **{k: r[k] + (blocks - 1) * min(max(r[k] - t[k], 0.0), stack_gib) for k in memory},
                **{f"{k}_upper": t[k] + blocks * max(r[k] - t[k], 0.0) for k in memory},
            )
    graph = real["latency"].get("64", {}).get("bytes")
    fp32 = real.get("fp32_bytes") and blocks * real["fp32_bytes"]
    bundled = real.get("bundle")
    budget = (tiny.get("params") or {}).get("memory")
    # per weights precision: the bundle as the weights bench derived it at real width, the other files as built
    host = real.get("host_tables")
    release_params = (real.get("params") or {}).get("release") or {}
    held = release_params.get("host_weights_precision", "bf16")
    # the release's files beside the bundle: its host tables at clef-flash's vocabulary (as built: the
    # release's precision), the rest (tokenizer, config, reference records, manifest) as the run built them
    others = real.get("release_bytes", 0) - (bundled["bytes"] if bundled else 0)
    if host:
        others += clef_flash_host_bytes(host, held) - host["file_bytes"]
    by_weights = (
        {name: blocks * b + others for name, b in ((real.get("weights") or {}).get("bundle_bytes") or {}).items()}
        if bundled and blocks
        else None
    )
    return ClefFlash(
        blocks=blocks,
        stages=out,
        # a stage measured at real width with no tiny record (no `make release` here before the bench):
        # the runtime cannot be told from the weights, so it is not extrapolated
        without_tiny_run=sorted(n for n in real["stages"] if n not in tiny["stages"]),
        row_graph_bytes_per_L=graph and blocks * graph,
        # the bundle's weights and heads grow with the layers; the release's other files (host tables,
        # tokenizer, reference records) are the same at any depth
        bundle_bytes=bundled and blocks * bundled["bytes"],
        release_bytes=bundled and blocks * bundled["bytes"] + others,
        # per weights precision: the bundle as the weights bench derived it at real width, the other files as built
        release_bytes_by_weights=by_weights,
        release_bytes_by_weights_and_host=with_host_tables(by_weights, host, held),
        snapshot_bytes=CLEF_FLASH_SNAPSHOT_BYTES,
        fp32_stack_bytes=fp32,
        memory_budget_gib=(float(budget["factor"]) * fp32) / 2**30 + float(budget["overhead_gib"])
        if budget and fp32
        else None,
    )


def clef_flash_host_bytes(host: dict, precision: str) -> int:
    """clef-flash's host tables at `precision`: each of the run's tables (HostFiles) at CLEF_FLASH_VOCAB rows."""
    from scripts.qwen35 import host_tables

    return sum(host_tables.stored_bytes((CLEF_FLASH_VOCAB, shape[1]), precision) for shape in host["shapes"].values())


def with_host_tables(
    by_weights: dict[str, int] | None, host: dict | None, held: str
) -> dict[str, dict[str, int]] | None:
    """Each release of `by_weights` (its host tables at `held`) with clef-flash's host tables stored at each of
    host_tables.MEASURED instead: the tables are the same at any depth, only their precision changes them."""
    from scripts.qwen35 import host_tables

    if not by_weights or not host:
        return None
    at = {hp: clef_flash_host_bytes(host, hp) - clef_flash_host_bytes(host, held) for hp in host_tables.MEASURED}
    return {name: {hp: b + change for hp, change in at.items()} for name, b in by_weights.items()}


def interpolated(points: dict[int, float], size: int) -> float:
    """A figure at `size` from figures measured at other sizes: linear between the two around it, the
    nearest two's line beyond them, the one figure when only one was measured."""
    xs = sorted(points)
    if size in points or len(xs) == 1:
        return points.get(size, points[xs[0]])
    lo, hi = (
        (xs[0], xs[1])
        if size < xs[0]
        else (xs[-2], xs[-1])
        if size > xs[-1]
        else next((a, b) for a, b in zip(xs, xs[1:], strict=False) if a <= size <= b)
    )
    return points[lo] + (points[hi] - points[lo]) * (size - lo) / (hi - lo)


@dataclasses.dataclass(frozen=True)
class DefaultPipeline(Record):
    """The default params' pipeline on clef-flash (default_pipeline): each stage's seconds and peak
    anonymous memory, the totals, and the largest peak against clef-flash's memory budget."""

    lengths: list[int]
    pairs: list[dict]
    stages: dict[str, dict]
    seconds: float
    hours: float
    gpu_hours: float
    accelerator_hours: float | None
    peak_anon_gib: float | None
    peak_anon_stage: str | None
    memory_budget_gib: float | None
    within_budget: bool


def default_pipeline(clef: dict, measured: dict, default: dict) -> DefaultPipeline:
    """The default params' pipeline (default["lengths"], default["pairs"]) on clef-flash, from the
    per-stage extrapolation `clef` of the real-width run, whose own lengths and pairs are `measured`:
    a per-L or per-pair stage at a size the run did not have is interpolated in L (P + S); verify_model
    is scaled by the sum of the lengths, release by the number of graphs. -> every stage's seconds and
    peak anonymous memory, the total, and the largest peak against clef-flash's memory budget."""
    by_base: dict[str, dict[int | None, dict]] = {}
    for name, figures in clef["stages"].items():
        base, size = stage_size(name)
        by_base.setdefault(base, {})[size] = figures
    lengths, pairs = default["lengths"], [p["prefix"] + p["suffix"] for p in default["pairs"]]
    measured_lengths = measured["lengths"]
    graphs = len(lengths) + len(pairs)
    measured_graphs = len(measured_lengths) + len(measured["pairs"])

    def at(base: str, size: int) -> dict[str, float]:
        found = by_base[base]
        keys = [k for k in ("seconds", "peak_anon_gib", "accelerator_seconds") if all(k in f for f in found.values())]
        out = {k: interpolated({n: f[k] for n, f in found.items()}, size) for k in keys}
        if all(f.get("parts") is not None for f in found.values()):
            names = {p for f in found.values() for p in f["parts"]}
            out["parts"] = {p: interpolated({n: f["parts"].get(p, 0.0) for n, f in found.items()}, size) for p in names}
        return out

    stages = {}
    for base, found in sorted(by_base.items()):
        if base in PER_LENGTH:
            stages.update({f"{base}@{n}": at(base, n) for n in lengths})
        elif base in PER_PAIR:
            stages.update(
                {f"{base}@{p['prefix']}_{p['suffix']}": at(base, p["prefix"] + p["suffix"]) for p in default["pairs"]}
            )
        else:
            f = dict(found[None])
            bundled = (default.get("release") or {}).get("layout") == "bundle"
            scale = (
                sum(lengths) / sum(measured_lengths)
                if base in BY_LENGTHS
                else 1.0  # the release hashes and packs the bundle: about one graph's bytes, however many
                if base == "release" and bundled
                else graphs / measured_graphs
                if base in BY_GRAPHS
                else 1.0
            )
            stages[base] = {"seconds": f["seconds"] * scale, "peak_anon_gib": f.get("peak_anon_gib")}
            if f.get("parts") is not None:
                stages[base]["parts"] = {p: v * scale for p, v in f["parts"].items()}
    peaks = {n: f["peak_anon_gib"] for n, f in stages.items() if f.get("peak_anon_gib") is not None}
    top = max(peaks, key=peaks.get) if peaks else None
    seconds = sum(f["seconds"] for f in stages.values())
    gpu = [f for n, f in stages.items() if stage_size(n)[0] in GPU_STAGES]
    # inside the accelerator: known only when every GPU stage's record has it
    accelerator = sum(f["accelerator_seconds"] for f in gpu) if all("accelerator_seconds" in f for f in gpu) else None
    budget = clef.get("memory_budget_gib")
    return DefaultPipeline(
        lengths=lengths,
        pairs=default["pairs"],
        stages=stages,
        seconds=seconds,
        hours=seconds / 3600,
        gpu_hours=sum(f["seconds"] for f in gpu) / 3600,
        accelerator_hours=accelerator / 3600 if gpu and accelerator is not None else None,
        peak_anon_gib=peaks.get(top),
        peak_anon_stage=top,
        memory_budget_gib=budget,
        within_budget=budget is not None and top is not None and peaks[top] <= budget,
    )


@dataclasses.dataclass(frozen=True)
class Machine(Record):
    """The machine a benchmark ran on: CPU model, cores, memory, torch's version."""

    cpu: str
    cores: int | None
    memory_bytes: int
    torch: str


@dataclasses.dataclass(frozen=True)
class Efficiency(Record):
    """How close the real-width row graph comes to this machine's fp32 matmul peak."""

    matmul_peak: MatmulPeak
    row_graph: GraphRate
    fraction_of_peak: float
    target_fraction: float
    meets_target: bool


def machine() -> Machine:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return Machine(cpu=cpu, cores=os.cpu_count(), memory_bytes=mem, torch=torch.__version__)


@dataclasses.dataclass(frozen=True)
class Bench(Record):
    """results/bench.json: the machine, both workspaces, the real-width graph's efficiency, and clef-flash's
    needs extrapolated from them."""

    machine: Machine
    measured_utc: str
    tiny: Workspace
    real_width: Workspace
    efficiency: Efficiency
    clef_flash: ClefFlash


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real-width", type=Path, default=layout.REAL_WIDTH)
    ws = ap.parse_args().real_width
    if not (ws / "results/snapshot.json").is_file():
        raise ClefError(f"no real-width run in {ws}: run make real-width first")
    tiny, real = workspace(Path(".")), workspace(ws)
    peak = matmul_peak()
    rate = graph_rate(ws, 64)
    ratio = rate.gflops / peak.gflops
    efficiency = Efficiency(
        matmul_peak=peak,
        row_graph=rate,
        fraction_of_peak=ratio,
        target_fraction=TARGET_FRACTION_OF_PEAK,
        meets_target=ratio >= TARGET_FRACTION_OF_PEAK,
    )
    measured_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    clef = extrapolate(tiny.to_json(), real.to_json())
    run = default_pipeline(clef.to_json(), real.params, tiny.params)
    doc = Bench(
        machine=machine(),
        measured_utc=measured_utc,
        tiny=tiny,
        real_width=real,
        efficiency=efficiency,
        clef_flash=dataclasses.replace(clef, default_pipeline=run),
    )
    atomic.write_json(layout.BENCH, doc.to_json())
    if clef.without_tiny_run:
        print(f"bench: {UNEXTRAPOLATED} ({len(clef.without_tiny_run)} stages)")
    print(
        f"bench: fp32 matmul peak {peak.gflops:.1f} GFLOP/s (torch.mm {PEAK_N}^2, {peak.threads} threads); "
        f"real-width row graph L=64 ({rate.bytes / 2**30:.2f} GiB) {rate.median_s:.2f} s, "
        f"{rate.gflops:.1f} GFLOP/s = {ratio:.2f} of peak (target {TARGET_FRACTION_OF_PEAK}) -> {layout.BENCH}"
    )


if __name__ == "__main__":
    run_stage(main, budget=False)
