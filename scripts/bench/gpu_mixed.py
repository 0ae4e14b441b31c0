"""Where the GPU accelerator's mixed mode (fp16 storage, fp32 accumulation) stands against the torch-float16
floor, and where it loses: one run on this machine -> results/gpu_mixed.json.

1. spread: the GPU check's row records at L=64 (tflite_check.row_records: full and padded), each again with
   its embeddings moved by less than one fp16 step (relative noise in [-2^-11, 2^-11], seeds 1..PERTURBED):
   the floor (stock transformers in torch float16), fp16 and mixed against stock float64, global and worst
   position, and each mode's ratio to the floor of the same inputs. The floor is itself one draw: inputs
   that torch float16 cannot tell apart move it by the factor this records.
2. trace: the first decoder layer cut into its parts (runs of consecutive ops of one module, from the
   converted graph's tensor names: scripts/litert/sections.py sections_at); each part alone runs in mixed
   inside an otherwise fp32 run of the whole graph on the accelerator, against the same part in fp32 with
   its outputs rounded to fp16 once (what torch float16 stores between ops): the final hidden state's
   error against float64, median over the record and its perturbations. A part far above its single
   rounding is where mixed loses more than storage in fp16 must.

    cd /work/main && .venv/bin/python -m scripts.bench.gpu_mixed    # after make release
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import statistics
import time
from pathlib import Path

import torch
from ai_edge_litert.tools import flatbuffer_utils

from scripts.checkpoint import snapshot
from scripts.checks import compare, gpu_check, tflite_check
from scripts.layers import kernel_form
from scripts.litert import gpu_accelerator, sections, tflite_file
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.errors import ClefError, run_command
from scripts.pipeline.records import Record, keyed
from scripts.qwen35 import patch
from scripts.qwen35.host import Host

L = 64
PERTURBED = 5  # perturbed copies of each record
TRACE_RECORD = "padded"
OUT = Path("results/gpu_mixed.json")
SIGNATURE = "serving_default"


def sig(x: float) -> float:
    return float(f"{x:.4g}")


def perturbed(embeds: torch.Tensor, seed: int) -> torch.Tensor:
    """embeds moved by a relative amount in [-2^-11, 2^-11] per element (seed 0: unmoved)."""
    if not seed:
        return embeds
    gen = torch.Generator().manual_seed(seed)
    return embeds * (1 + (torch.rand(embeds.shape, generator=gen) * 2 - 1) * 2.0**-11)


@dataclasses.dataclass(frozen=True)
class HiddenErrors(Record):
    """A final hidden state's error against float64: the whole state's (`global` in the JSON) and the worst
    position's."""

    global_: float = keyed("global")
    worst_position: float

    def rounded(self) -> HiddenErrors:
        """Each error as the JSON keeps it (sig)."""
        return HiddenErrors(sig(self.global_), sig(self.worst_position))

    def over(self, floor: HiddenErrors) -> HiddenErrors:
        """Each error as a ratio to `floor`'s."""
        return HiddenErrors(sig(self.global_ / floor.global_), sig(self.worst_position / floor.worst_position))

    @staticmethod
    def median(runs: list[HiddenErrors]) -> HiddenErrors:
        """Each error's median over `runs`, as the JSON keeps it."""
        return HiddenErrors(
            sig(statistics.median(e.global_ for e in runs)), sig(statistics.median(e.worst_position for e in runs))
        )


def errors(h: torch.Tensor, exact: torch.Tensor) -> HiddenErrors:
    """The error of `h` against `exact`."""
    return HiddenErrors(compare.rel(h, exact), max(compare.rel_per_position(h, exact)))


def parts(path: Path, layer: int = 0) -> list[tuple[str, range]]:
    """[(part, ops)] of decoder layer `layer`: runs of consecutive ops whose first output is named after
    the same module path (the converter names tensors after the module that computed them)."""
    sg = graph_object(path).subgraphs[0]
    runs: list[tuple[str, list[int]]] = []
    for i, op in enumerate(sg.operators):
        name = tflite_file.text(sg.tensors[op.outputs[0]].name).split(";")[0]
        found = re.search(r"DecoderLayer_(\d+)(/.*)?$", name)
        if not found or int(found.group(1)) != layer:
            if runs and found and int(found.group(1)) > layer:
                break
            continue
        tag = "/".join(c.rsplit(".", 1)[-1] for c in (found.group(2) or "/residual add").strip("/").split("/"))
        if runs and runs[-1][0] == tag and runs[-1][1][-1] == i - 1:
            runs[-1][1].append(i)
        else:
            runs.append((tag, [i]))
    return [(tag, range(ops[0], ops[-1] + 1)) for tag, ops in runs]


class RoundedOutputs:
    """A compiled section whose outputs are rounded to fp16 once: fp32 arithmetic, fp16 storage of the result."""

    def __init__(self, compiled):
        self.compiled = compiled

    def signature(self, name=None):
        run = self.compiled.signature(name)
        return lambda **feeds: {k: v.half().float() for k, v in run(**feeds).items()}

    def close(self):
        self.compiled.close()


@dataclasses.dataclass(frozen=True)
class SpreadRow(Record):
    """One record (seed 0) or one of its perturbed copies: the floor and each half mode against float64,
    and each mode's ratio to the floor."""

    seed: int
    floor: HiddenErrors
    fp16: HiddenErrors
    fp16_over_floor: HiddenErrors
    mixed: HiddenErrors
    mixed_over_floor: HiddenErrors


@dataclasses.dataclass(frozen=True)
class Spread(Record):
    """One record kind's rows, how far its floor moves, and each half mode's median ratio to the floor."""

    real_tokens: int
    rows: list[SpreadRow]
    floor_max_over_min: float
    fp16_over_floor_median: float
    mixed_over_floor_median: float


Spreads = dict[str, Spread]
"""A record kind (tflite_check.row_records) -> its spread."""


def spread(model, host, stock, path: Path) -> Spreads:
    compiled = {m: gpu_accelerator.compile(path, m) for m in gpu_check.HALF_MODES}
    out = {}
    for kind, (n, inputs) in tflite_check.row_records(host, L, model.config.vocab_size, ("full", "padded")).items():
        rows = []
        for seed in range(PERTURBED + 1):
            feeds = {**inputs, "embeds": perturbed(inputs["embeds"], seed)}
            exact, floor = stock.hidden(feeds["embeds"][:, :n])
            row = {"seed": seed, "floor": errors(floor, exact).rounded()}
            for mode, c in compiled.items():
                e = errors(c.signature()(**feeds)["hidden"][0, :n], exact)
                row[mode] = e.rounded()
                row[f"{mode}_over_floor"] = e.over(row["floor"])
            rows.append(SpreadRow(**row))
            print(
                f"spread {kind} seed {seed}: " + ", ".join(f"{k} {row[k].to_json()}" for k in row if k != "seed"),
                flush=True,
            )
        floors = [r.floor.global_ for r in rows]
        out[kind] = Spread(
            real_tokens=n,
            rows=rows,
            floor_max_over_min=sig(max(floors) / min(floors)),
            **{
                f"{mode}_over_floor_median": sig(
                    statistics.median(getattr(r, f"{mode}_over_floor").global_ for r in rows)
                )
                for mode in compiled
            },
        )
    for c in compiled.values():
        c.close()
    return out


@dataclasses.dataclass(frozen=True)
class MixedPartFigures(Record):
    """A run of ops alone in mixed and alone in fp32 rounded to fp16 once: the final hidden state's error
    against float64, and mixed's global error over the rounding's."""

    mixed: HiddenErrors
    fp32_rounded_once: HiddenErrors
    mixed_over_rounding: float


@dataclasses.dataclass(frozen=True)
class TracedPart(MixedPartFigures):
    """One part of the decoder layer (its module path) and its ops [start, stop)."""

    part: str
    ops: list[int]


@dataclasses.dataclass(frozen=True)
class TracedPiece(MixedPartFigures):
    """One piece of the largest part, cut after a matmul: its ops [start, stop) and their kinds."""

    ops: list[int]
    op_kinds: list[str]


@dataclasses.dataclass(frozen=True)
class LargestPart(Record):
    """The part of the decoder layer with the most ops (its module path), piece by piece."""

    part: str
    pieces: list[TracedPiece]


@dataclasses.dataclass(frozen=True)
class Trace(Record):
    """The first decoder layer part by part on one record kind, then its largest part piece by piece."""

    record: str
    real_tokens: int
    parts: list[TracedPart]
    largest_part: LargestPart


def part_figures(path: Path, ops: range, feeds: list[dict], exact: list[torch.Tensor], n: int) -> MixedPartFigures:
    """Ops `ops` alone in mixed inside an fp32 run of the whole graph, and alone in fp32 with their outputs
    rounded to fp16 once: the final hidden state's error against float64, median over `feeds`."""
    graph = sections.SectionedGraph(path, 1 << 62, cuts={SIGNATURE: [0, ops.start, ops.stop, op_count(path)]})
    figures = {}
    for how in ("mixed", "fp32_rounded_once"):

        def compile_section(p, how=how):
            inside = Path(p).stem.endswith("_1")
            if how == "mixed":
                return gpu_accelerator.compile(p, "mixed" if inside else "fp32")
            c = gpu_accelerator.compile(p, "fp32")
            return RoundedOutputs(c) if inside else c

        outs = graph.run(compile_section, SIGNATURE, feeds)
        figures[how] = HiddenErrors.median(
            [errors(torch.as_tensor(o["hidden"])[0, :n], x) for o, x in zip(outs, exact, strict=True)]
        )
    graph.close()
    return MixedPartFigures(
        mixed=figures["mixed"],
        fp32_rounded_once=figures["fp32_rounded_once"],
        mixed_over_rounding=sig(figures["mixed"].global_ / figures["fp32_rounded_once"].global_),
    )


MATMULS = ("FULLY_CONNECTED", "BATCH_MATMUL")


def split_at_matmuls(path: Path, ops: range) -> list[range]:
    """`ops` cut after each matmul (its elementwise chain with the matmul that ends it), where a cut carries
    float32 tensors only."""
    model = graph_object(path)
    sg = model.subgraphs[0]
    outputs = [int(e.tensorIndex) for e in model.signatureDefs[0].outputs]
    cuts = [ops.start]
    for i in ops[:-1]:
        if tflite_file.op_name(model, sg.operators[i]) in MATMULS:
            try:
                sections.sections_at(model, 0, outputs, [0, i + 1, len(sg.operators)])
            except ClefError:
                continue
            cuts.append(i + 1)
    return [range(a, b) for a, b in zip(cuts, [*cuts[1:], ops.stop], strict=True)]


def trace(model, host, stock, path: Path) -> Trace:
    """Each part of the first decoder layer, then the largest part (the GatedDeltaNet's kernel) cut after
    each of its matmuls."""
    n, inputs = tflite_check.row_records(host, L, model.config.vocab_size, (TRACE_RECORD,))[TRACE_RECORD]
    feeds = [{**inputs, "embeds": perturbed(inputs["embeds"], seed)} for seed in range(PERTURBED + 1)]
    exact = [stock.hidden(f["embeds"][:, :n])[0] for f in feeds]
    found = parts(path)
    rows = []
    for tag, ops in found:
        figures = part_figures(path, ops, feeds, exact, n)
        rows.append(TracedPart(**vars(figures), part=tag, ops=[ops.start, ops.stop]))
        print(f"trace {tag} ops {ops.start}-{ops.stop}: {rows[-1].to_json()}", flush=True)
    tag, largest = max(found, key=lambda t: len(t[1]))
    model_object = graph_object(path)
    inner = []
    for ops in split_at_matmuls(path, largest):
        kinds = sorted({tflite_file.op_name(model_object, model_object.subgraphs[0].operators[i]) for i in ops})
        figures = part_figures(path, ops, feeds, exact, n)
        inner.append(TracedPiece(**vars(figures), ops=[ops.start, ops.stop], op_kinds=kinds))
        print(f"trace {tag} ops {ops.start}-{ops.stop}: {inner[-1].to_json()}", flush=True)
    return Trace(record=TRACE_RECORD, real_tokens=n, parts=rows, largest_part=LargestPart(part=tag, pieces=inner))


def graph_object(path: Path):
    return flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))


def op_count(path: Path) -> int:
    return len(graph_object(path).subgraphs[0].operators)


@dataclasses.dataclass(frozen=True)
class GpuMixed(Record):
    """results/gpu_mixed.json: the spread per record kind and the trace of the first decoder layer."""

    what: str
    measured_utc: str
    graph: str
    form: str
    metric: str
    spread: Spreads
    trace: Trace
    seconds: float


def main() -> None:
    start = time.time()
    path = layout.require(layout.row_path(L), f"export@{L}")
    gpu_accelerator.prove_mode("mixed")
    snap = snapshot.verify(snapshot.load_record())
    form = str(kernel_form.parse(params.load(["form"])["form"]))
    model, _, _ = patch.load(snap, form, progress=False)
    host, stock = Host(snap), gpu_check.StockReferences(model)
    measured_utc = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    spreads, traced = spread(model, host, stock, path), trace(model, host, stock, path)
    report = GpuMixed(
        what=__doc__.split("\n\n")[0],
        measured_utc=measured_utc,
        graph=str(path),
        form=form,
        metric="max |x - ref| / max |ref| (global) and the worst position's ||x - ref|| / ||ref||, ref: stock "
        "transformers in float64 on the same inputs",
        spread=spreads,
        trace=traced,
        seconds=round(time.time() - start, 1),
    )
    atomic.write_json(OUT, report.to_json())
    print(f"wrote {OUT} in {report.seconds:.0f} s")


if __name__ == "__main__":
    run_command(main)
