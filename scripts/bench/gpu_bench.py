"""What a user would pick instead of our graphs, run on the same LiteRT GPU accelerator (ML Drift over
WebGPU; here Mesa's lavapipe), one run on one machine -> results/gpu_bench.json.

Candidates at L=64 on one 64-token record: our row graph (artifacts/rows/row_L64.tflite) against the
stock `loop` kernel's row graph (converted here, as the export_stock stage does); and at the layer
level our GatedDeltaNet (the stack's first, under the form) against litert-torch 0.10.0's own Qwen3.5
GatedDeltaNet in its chunked, recurrent and fused modes, all with the same weights and inputs.
For each: the census, whether the GPU accelerator takes it alone (else what GPU|CPU refuses and how
many ops fall back), and per fp32/fp16 mode: finiteness, error against a float64 torch reference of
the same computation and the median run time (a benchmark figure, not a bound); as controls, the fp16
floor (the stock module in torch float16) and the same file on the CPU (XNNPACK). Why: a graph the GPU
accelerator compiles whole, and computes right in fp16, is the point of this project; this shows
whether the peers do.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import math
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from scripts.checkpoint import snapshot
from scripts.checks import compare, model_check, record_text
from scripts.litert import export, gpu_accelerator, tflite_file
from scripts.pipeline import atomic, layout, provenance
from scripts.pipeline.errors import ClefError, run_command
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.records import Record, optional
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host

L = 64
SEED = L  # conversion_bench's record: random_ids(L, vocab, L)
REPEATS = 5
OURS_ROW = Path("artifacts/rows/row_L64.tflite")
OUT = Path("results/gpu_bench.json")
MODES = {"fp32": True, "fp16": False}
STOCK_FORM = "loop"
# litert-torch's Qwen3_5StaticGatedDeltaNet: (use_fused_gdn, gdn_mode)
LITERT_MODES = {"chunked": (False, 1), "recurrent": (False, 0), "fused": (True, 0)}
# accelerator log lines that say nothing about the graph (plugins absent here, Dawn's limit notes)
_BOILERPLATE = (
    "IntelOpenvino",
    "libopenvino",
    "NPU accelerator",
    "artificially reduced",
    "libOpenCL",
    "Logging before InitGoogle",
    gpu_accelerator.REFUSED_HEAD,
)


# ---------------------------------------------------------------------------------------------
# the layer graphs: one GatedDeltaNet, hidden [1, L, H] and valid [1, L] in, hidden out


class LayerGraph(nn.Module):
    """One GatedDeltaNet as a graph; `mask` names its argument for valid (ours: attention_mask,
    litert-torch's: valid_mask)."""

    def __init__(self, gdn: nn.Module, mask: str):
        super().__init__()
        self.gdn = gdn
        self.mask = mask

    def forward(self, hidden, valid):
        return {"hidden": self.gdn(hidden, **{self.mask: valid})}


def litert_gdn(cfg, layer_idx: int, weights: dict[str, torch.Tensor], mode: str) -> nn.Module:
    """litert-torch's static GatedDeltaNet at the checkpoint's widths with `weights` (a stock layer's)."""
    from litert_torch.generative.export_hf.model_ext.qwen3_5.modeling_qwen3_5_static import Qwen3_5StaticGatedDeltaNet

    fused, gdn_mode = LITERT_MODES[mode]
    gdn = Qwen3_5StaticGatedDeltaNet(
        cfg.hidden_size,
        cfg.linear_num_value_heads,
        cfg.linear_num_key_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
        cfg.linear_conv_kernel_dim,
        cfg.rms_norm_eps,
        layer_idx,
        use_fused_gdn=fused,
        gdn_mode=gdn_mode,
        use_fp32=True,
    )
    gdn.load_state_dict(weights, strict=True)
    return gdn.eval()


def first_gdn_index(model) -> int:
    return next(i for i, layer in enumerate(model.layers) if layer.block_type == "linear_attention")


# ---------------------------------------------------------------------------------------------
# compiling and reading the accelerator's log


def short_refusal(line: str) -> str:
    """ "OP: reason <source path>" -> "OP: reason" (the path names one node; the reason is the news)."""
    return re.sub(r"(\s+\S*[;/]\S*)+$", "", line).strip()


def tally(lines) -> Counter[str]:
    """ "OP: reason" -> how many refusal lines say it, in the order first said. gpu_accelerator.refused_ops
    keeps one line per distinct text, so a reason printed without a node path stands for one or many nodes."""
    return Counter(short_refusal(line) for line in lines)


def notable_lines(log: str) -> list[str]:
    """The log's warnings and errors that concern the graph (e.g. "Shape mismatch in GpuModelBuilder")."""
    out = []
    for line in log.splitlines():
        s = line.strip()
        if re.search(r"warn|error|mismatch|fail|unresolved|^[EW]\d{4}", s, re.I) and not any(
            b in s for b in _BOILERPLATE
        ):
            if not s.startswith("└") and s not in out:
                out.append(s)
    return out


@dataclasses.dataclass(frozen=True)
class MixedCompile(Record):
    """A graph compiled for GPU | CPU: what the GPU refused (tally), how many ops each took (None where the
    log does not say), whether it is fully accelerated (None where it did not compile), the error, the log."""

    refused: dict[str, int]
    refused_lines: int
    gpu_ops: int | None
    cpu_ops: int | None
    fully_accelerated: bool | None
    error: str | None
    log: list[str]


def compile_mixed(path: Path, fp32: bool):
    """Compile for GPU | CPU; -> (Compiled or None, MixedCompile)."""
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator

    model, text, error = gpu_accelerator.load(path, HardwareAccelerator.GPU | HardwareAccelerator.CPU, fp32)
    counts = gpu_accelerator.FALLBACK.search(text)
    refused = gpu_accelerator.refused_ops(text)
    facts = MixedCompile(
        refused=tally(refused),
        refused_lines=len(refused),
        gpu_ops=int(counts.group(1)) if counts else None,
        cpu_ops=int(counts.group(2)) if counts else None,
        fully_accelerated=bool(model.is_fully_accelerated()) if model is not None else None,
        error=error,
        log=notable_lines(text),
    )
    if model is None:
        return None, facts
    name = gpu_accelerator.adapter_name(text) or "?"
    return gpu_accelerator.Compiled(path, fp32, model, name, facts.fully_accelerated, text), facts


def compile_cpu(path: Path):
    """The CPU (XNNPACK) control; -> (Compiled or None, error lines)."""
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator

    model, text, _ = gpu_accelerator.load(path, HardwareAccelerator.CPU)
    if model is None:
        return None, notable_lines(text)
    return gpu_accelerator.Compiled(path, True, model, "cpu", bool(model.is_fully_accelerated()), text), []


# ---------------------------------------------------------------------------------------------
# running


@dataclasses.dataclass(frozen=True)
class Run(Record):
    """A graph run on an accelerator: which (`accelerators`, and for a GPU whether it took the graph whole),
    its accuracy against the reference and its times; or, where it compiled but could not run, `error` and
    `log` in their place. The CPU control that did not compile holds only `error`, the log's lines.
    `over_floor`: an fp16 run's rel over the fp16 floor's."""

    accelerators: str | None = optional()
    fully_accelerated: bool | None = optional()
    finite: bool | None = optional()
    rel: float | None = optional()
    worst_position_rel: float | None = optional()
    worst_position: int | None = optional()
    median_position_rel: float | None = optional()
    median_s: float | None = optional()
    times_s: list[float] | None = optional()
    first_run_log: list[str] | None = optional()
    over_floor: float | None = optional()
    error: str | list[str] | None = optional()
    log: list[str] | None = optional()


def measure(compiled, feeds: dict[str, torch.Tensor], ref: torch.Tensor, repeats: int = REPEATS) -> Run:
    """Accuracy against `ref` and median seconds of one call (inputs written, run, outputs read),
        after one warm-up whose log is kept (some warnings only come at the first run); a graph that cannot
    run -> its error and log."""
    with gpu_accelerator.captured_stderr() as log:
        try:
            call = compiled.signature()
            out, error = call(**feeds)["hidden"], None
        except RuntimeError as exc:  # e.g. a custom op the runtime cannot resolve shows only here
            error = " ".join(str(exc).split())
    if error is not None:
        return Run(error=error, log=notable_lines(log["text"]))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call(**feeds)
        times.append(time.perf_counter() - t0)
    per_position = compare.rel_per_position(out, ref)
    worst = max(range(len(per_position)), key=lambda i: per_position[i])
    return Run(
        finite=bool(torch.isfinite(out).all()),
        rel=compare.rel(out, ref),
        worst_position_rel=per_position[worst],
        worst_position=worst,
        median_position_rel=statistics.median(per_position),
        median_s=statistics.median(times),
        times_s=times,
        first_run_log=notable_lines(log["text"]),
    )


def close(compiled) -> None:
    if compiled is not None and hasattr(compiled.model, "close"):
        compiled.model.close()


@dataclasses.dataclass(frozen=True)
class GpuAlone(Record):
    """A graph compiled for the GPU accelerator alone: whether it compiled, and whether whole with the log's
    notable lines, or the accelerator's error."""

    compiled: bool
    fully_accelerated: bool | None = optional()
    log: list[str] | None = optional()
    error: str | None = optional()


def gpu_rows(
    path: Path, feeds: dict[str, torch.Tensor], ref: torch.Tensor, adapters: set[str]
) -> tuple[dict[str, GpuAlone], dict[str, MixedCompile] | None, dict[str, Run | None]]:
    """GPU alone, else GPU | CPU, in fp32 and fp16 mode: what compiled and how it ran, per mode."""
    gpu_alone: dict[str, GpuAlone] = {}
    gpu_cpu: dict[str, MixedCompile] = {}
    runs: dict[str, Run | None] = {}
    for mode, fp32 in MODES.items():
        compiled, how = None, "GPU"
        try:
            compiled = gpu_accelerator.compile(path, "fp32" if fp32 else "fp16")
            gpu_alone[mode] = GpuAlone(
                compiled=True, fully_accelerated=compiled.fully_accelerated, log=notable_lines(compiled.log)
            )
        except ClefError as exc:
            gpu_alone[mode] = GpuAlone(compiled=False, error=str(exc).replace(str(path), path.name))
            compiled, gpu_cpu[mode] = compile_mixed(path, fp32)
            how = "GPU|CPU"
        if compiled is None:
            runs[mode] = None
            continue
        adapters.add(compiled.adapter)
        measured = measure(compiled, feeds, ref)
        runs[mode] = dataclasses.replace(measured, accelerators=how, fully_accelerated=compiled.fully_accelerated)
        close(compiled)
    return gpu_alone, gpu_cpu or None, runs


@dataclasses.dataclass(frozen=True)
class Candidate(Record):
    """One row of the table: a graph's census, the converted module's own error in fp32 torch (where there is
    one), what the GPU accelerator took per mode and how it ran, and the CPU control."""

    name: str
    level: str
    what: str
    convert_seconds: float | None
    op_total: int
    max_rank: int
    violations: list[str]
    ops: dict[str, int]
    gpu_alone: dict[str, GpuAlone]
    gpu_cpu: dict[str, MixedCompile] | None
    runs: dict[str, Run | None]
    cpu_control: Run
    torch_fp32_rel: float | None = optional()


def candidate(
    name: str,
    level: str,
    what: str,
    path: Path,
    feeds: dict[str, torch.Tensor],
    refs: tuple[torch.Tensor, torch.Tensor],
    adapters: set[str],
    torch_module=None,
    convert_seconds: float | None = None,
) -> Candidate:
    """One row of the table; `refs` = (float64 reference, the fp16 floor: stock in torch float16)."""
    ref, floor = refs
    census = tflite_file.census(path)
    torch_fp32_rel = None
    if torch_module is not None:  # the converted module itself in fp32 torch: the function it computes
        with torch.no_grad():
            torch_fp32_rel = compare.rel(torch_module(**feeds)["hidden"], ref)
    gpu_alone, gpu_cpu, runs = gpu_rows(path, feeds, ref, adapters)
    fp16 = runs["fp16"]
    if fp16 is not None and fp16.rel is not None:
        runs["fp16"] = dataclasses.replace(fp16, over_floor=fp16.rel / compare.rel(floor, ref))
    cpu, error = compile_cpu(path)
    cpu_control = Run(error=error) if cpu is None else dataclasses.replace(measure(cpu, feeds, ref), accelerators="CPU")
    close(cpu)
    row = Candidate(
        name=name,
        level=level,
        what=what,
        convert_seconds=convert_seconds,
        op_total=census["op_total"],
        max_rank=census["max_rank"],
        violations=tflite_file.violations(census),
        ops=census["ops"],
        gpu_alone=gpu_alone,
        gpu_cpu=gpu_cpu,
        runs=runs,
        cpu_control=cpu_control,
        torch_fp32_rel=torch_fp32_rel,
    )
    print(
        f"{name}: {row.op_total} ops, GPU alone fp32/fp16: "
        f"{row.gpu_alone['fp32'].compiled}/{row.gpu_alone['fp16'].compiled}",
        flush=True,
    )
    return row


def convert(module: nn.Module, feeds: dict[str, torch.Tensor], path: Path) -> float:
    t0 = time.perf_counter()
    export.convert(module, feeds, path)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# the run


@dataclasses.dataclass(frozen=True)
class LevelReferences:
    """(float64 reference, fp16 floor) of each level the candidates run at: the stock twin's row and the
    stock GatedDeltaNet; the floor is the same stock module run in torch float16."""

    row: tuple[torch.Tensor, torch.Tensor]
    layer: tuple[torch.Tensor, torch.Tensor]


def references(model, inputs: Tensors, layer_idx: int, layer_in: torch.Tensor) -> LevelReferences:
    """The stock twin's row on `inputs` and its GatedDeltaNet on `layer_in`, in float64 and float16."""
    twin = patch.stock_twin(model)
    gdn = twin.layers[layer_idx].linear_attn
    embeds = inputs["embeds"]
    with torch.no_grad():
        row = (
            model_check.in_float64(twin)(inputs_embeds=embeds.double(), use_cache=False).last_hidden_state,
            copy.deepcopy(twin).half()(inputs_embeds=embeds.half(), use_cache=False).last_hidden_state,
        )
        layer = (model_check.in_float64(gdn)(layer_in.double()), copy.deepcopy(gdn).half()(layer_in.half()))
    return LevelReferences(row=row, layer=layer)


@dataclasses.dataclass(frozen=True)
class Floor(Record):
    """The fp16 floor at one level: the stock module in torch float16 against float64, whole and worst position."""

    rel: float
    worst_position_rel: float

    @staticmethod
    def of(exact: torch.Tensor, half: torch.Tensor) -> Floor:
        return Floor(rel=compare.rel(half, exact), worst_position_rel=max(compare.rel_per_position(half, exact)))


@dataclasses.dataclass(frozen=True)
class Floors(Record):
    """The fp16 floor of each level (LevelReferences)."""

    row: Floor
    layer: Floor


def floor_figures(refs: LevelReferences) -> Floors:
    return Floors(row=Floor.of(*refs.row), layer=Floor.of(*refs.layer))


def json_safe(obj):
    """inf and NaN as the strings "inf" / "nan" (JSON has no such numbers)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


@dataclasses.dataclass(frozen=True)
class Environment(Record):
    """Where the bench ran: the GPU adapters seen, Mesa's Vulkan drivers, package versions, the machine."""

    adapters: list[str]
    mesa_vulkan_drivers: str | None
    versions: dict[str, str | None]
    python: str
    machine: str
    cpus: int | None
    torch_threads: int


def environment(adapters: set[str]) -> Environment:
    try:
        mesa = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "mesa-vulkan-drivers"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        mesa = None
    return Environment(
        adapters=sorted(adapters),
        mesa_vulkan_drivers=mesa,
        versions=provenance.package_versions(),
        python=platform.python_version(),
        machine=platform.machine(),
        cpus=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
    )


@dataclasses.dataclass(frozen=True)
class BenchInput(Record):
    """The record every candidate ran on: its token count, record_text.random_ids's seed, its real tokens."""

    tokens: int
    seed: int
    real: int


@dataclasses.dataclass(frozen=True)
class BenchReferences(Record):
    """What each level's float64 reference and fp16 floor are, and the floor's figures per level."""

    row: str
    layer: str
    fp16_floor: str
    floor: Floors


@dataclasses.dataclass(frozen=True)
class GpuBench(Record):
    """results/gpu_bench.json: the candidates on the GPU accelerator, and what they ran against and where."""

    revision: str
    form: str
    L: int
    record: BenchInput
    repeats: int
    date: str
    reference: BenchReferences
    timing: str
    environment: Environment
    loadavg_start: list[float]
    loadavg_end: list[float]
    candidates: list[Candidate]
    seconds: float


def main() -> None:
    started, t0 = datetime.datetime.now(datetime.UTC), time.perf_counter()
    load_start = os.getloadavg()
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    form = (tflite_file.read_metadata(layout.require(OURS_ROW, "export")) or {}).get("form")
    if not form:
        raise ClefError(f"{OURS_ROW} names no form in its metadata")
    model, _, _ = patch.load(snap, form, progress=False)
    cfg = model.config
    inputs = Host(snap).record(record_text.random_ids(L, cfg.vocab_size, SEED), L)
    i = first_gdn_index(model)
    with torch.no_grad():
        layer_in = model.layers[i].input_layernorm(inputs["embeds"])
    layer_feeds = {"hidden": layer_in, "valid": inputs["valid"]}
    refs = references(model, inputs, i, layer_in)
    weights = patch.stock_twin(model).layers[i].linear_attn.state_dict()
    adapters: set[str] = set()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_bench.") as tmp:
        tmp = Path(tmp)
        ours_row = row_graph.ClefRowPrefill(model, L).eval()
        rows.append(
            candidate(
                "ours_row",
                "row",
                f"our row graph, form {form} ({OURS_ROW})",
                OURS_ROW,
                inputs,
                refs.row,
                adapters,
                torch_module=ours_row,
            )
        )
        ours_layer = LayerGraph(model.layers[i].linear_attn, "attention_mask")
        layers = {"ours_layer": (f"our GatedDeltaNet (layer {i}) under {form}", ours_layer)}
        for mode in LITERT_MODES:
            layers[f"litert_{mode}_layer"] = (
                f"litert-torch Qwen3_5StaticGatedDeltaNet (layer {i} weights), "
                f"{mode} mode {LITERT_MODES[mode]} (use_fused_gdn, gdn_mode)",
                LayerGraph(litert_gdn(cfg, i, weights, mode), "valid_mask"),
            )
        for name, (what, module) in layers.items():
            path = tmp / f"{name}.tflite"
            seconds = convert(module.eval(), layer_feeds, path)
            rows.append(
                candidate(
                    name,
                    "layer",
                    what,
                    path,
                    layer_feeds,
                    refs.layer,
                    adapters,
                    torch_module=module,
                    convert_seconds=seconds,
                )
            )
        stock, _, _ = patch.load(snap, STOCK_FORM, progress=False)
        stock_row = row_graph.ClefRowPrefill(stock, L).eval()
        path = tmp / "stock_row.tflite"
        seconds = convert(stock_row, inputs, path)
        rows.append(
            candidate(
                "stock_row",
                "row",
                f"the stock `{STOCK_FORM}` kernel's row graph, converted here",
                path,
                inputs,
                refs.row,
                adapters,
                torch_module=stock_row,
                convert_seconds=seconds,
            )
        )
    doc = GpuBench(
        revision=rec.revision,
        form=form,
        L=L,
        record=BenchInput(tokens=L, seed=SEED, real=L),
        repeats=REPEATS,
        date=started.isoformat(timespec="seconds"),
        reference=BenchReferences(
            row="model_check.in_float64(stock_twin(model)), last_hidden_state",
            layer=f"model_check.in_float64(stock Qwen3_5GatedDeltaNet, layer {i}) on "
            f"layers[{i}].input_layernorm(embeds)",
            fp16_floor="the same stock module in torch float16 (its chunk kernel casts to "
            "float32 inside) vs float64; fp16 runs give over_floor = rel / floor rel",
            floor=floor_figures(refs),
        ),
        timing="median of REPEATS calls after one warm-up; a call writes inputs, runs, reads outputs",
        environment=environment(adapters),
        loadavg_start=list(load_start),
        loadavg_end=list(os.getloadavg()),
        candidates=rows,
        seconds=time.perf_counter() - t0,
    )
    atomic.write_json(OUT, json_safe(doc.to_json()))
    print(f"gpu_bench: {len(rows)} candidates -> {OUT} in {doc.seconds:.0f} s")


if __name__ == "__main__":
    run_command(main)  # not a DVC stage: no results/runtime/ record
