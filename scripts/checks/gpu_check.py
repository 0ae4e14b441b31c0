"""Verification on LiteRT's GPU accelerator: every signature of a graph compiled for the GPU alone,
in each of its modes (scripts/litert/gpu_accelerator.py: fp32, fp16, mixed = fp16 storage with fp32
accumulation), each mode first shown by its effect on the precision probe, on host-built records.

- fp32: every output of every signature against the torch graph on the same inputs; a pair's suffix
  is fed the torch prefix's state, so each signature is judged on its own. Bound: verify_gpu.max_rel_fp32.
- fp16 and mixed (the half modes): every output finite (a failure otherwise), and the hidden states
  against stock transformers in float64, beside the half-precision floor: stock transformers run in
  torch float16 on the same tokens against the same float64. Each row's ratio to the floor, global
  and per position, is held to verify_gpu.fp16_max_over_floor in the modes verify_gpu.held_to_floor
  names (a failure otherwise) and recorded against it in the others.
- pairs also chain on the GPU: suffix(prefix(x[:p]), x[p:p+s]) for p = P/2, s in {1, S},
  in both modes, against the row graph in torch (fp32) and stock float64 (fp16); the prefix runs
  once for both its suffixes and is also the prefix signature's check.
Errors: scripts/checks/compare.py, global and per position; fp32 holds both to their bounds
(verify_gpu.max_rel_fp32, max_rel_per_position_fp32).
Depth (verify_gpu.layers): with `block`, the graph is cut after its first block (checked_layers) and
every reference is the first block's residual stream (residual_stream), so both sides stop at the
same place.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass

import torch

from scripts.checks import compare, layerwise, model_check, records
from scripts.checks.tflite_check import RowRecords
from scripts.litert import gpu_accelerator
from scripts.litert.export import DEFAULT_SIGNATURE
from scripts.pipeline import params, profile
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.records import Record
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host, PairRunner
from scripts.qwen35.row_graph import ClefRowPrefill

MODES = gpu_accelerator.MODES
HALF_MODES = params.GPU_HALF_MODES  # held against stock float64 and the torch float16 floor
# What the accelerator runs, a subset of the CPU checks' records: on a machine without a GPU its runs
# are the slowest part of the pipeline, each costs about what a record costs at that length. One record
# with real tokens and padding both: rows the right-padded record (2/3 real); pairs one prefix of P/2
# real tokens, the signature check's and the chained one, with suffixes of 1 and S real tokens.
ROW_RECORDS = ("padded",)


def chaining_prefixes(P: int) -> list[int]:
    """The real prefix lengths the GPU chains from (a subset of records.chaining_lengths)."""
    return [P // 2]


def checked_layers(depth: str, config, source: str) -> int | None:
    """verify_gpu.layers -> how many decoder layers the accelerator runs: `block`, the first hybrid
    block (its GatedDeltaNets and its attention layer: every op kind of the graph), when the stack has
    more; `all` (None) every layer; `auto` every layer of the tiny checkpoint (seconds on a software
    GPU), the first block of any other (model.source)."""
    from scripts.qwen35 import text_stack

    depth = params.gpu_depth(depth, source)
    n = text_stack.first_block(config)
    return n if depth == "block" and n < config.num_hidden_layers else None


@contextlib.contextmanager
def residual_stream(*models):
    """Each model's final norm made the identity inside the block (restored after): their output is then
    the residual stream after their layers, what the accelerator's first block computes."""
    norms = [m.norm for m in models]
    try:
        for m in models:
            m.norm = torch.nn.Identity()
        yield
    finally:
        for m, norm in zip(models, norms, strict=True):
            m.norm = norm


class StockReferences:
    """Stock transformers (the same weights) in float64, the truth, and in torch float16, the floor."""

    def __init__(self, model):
        self.twin = patch.stock_twin(model)

    def exact(self, embeds: torch.Tensor) -> torch.Tensor:
        """[1, n, H] real-token embeddings -> float64 hidden [n, H], converted layer at a time
        (scripts/checks/layerwise.py)."""
        twin = self.twin
        with torch.no_grad(), model_check.exact_by_layer(twin):
            return twin(inputs_embeds=embeds.double(), use_cache=False).last_hidden_state[0]

    def hidden(self, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[1, n, H] real-token embeddings -> (float64 hidden [n, H], float16 hidden [n, H])."""
        twin = self.twin
        with torch.no_grad(), layerwise.cast_by_layer(twin, twin.layers, torch.float16):
            half = twin(inputs_embeds=embeds.half(), use_cache=False).last_hidden_state[0]
        return self.exact(embeds), half


@dataclass(frozen=True)
class HalfFigures(Record):
    """A half mode's hidden states and the floor (stock float16), both against float64, global and per
    position (the worst and each position's), and their ratios: over_floor (global) and
    over_floor_per_position (the worst positions' figures). A row holds them as `to_json()`."""

    rel_vs_f64: float
    rel_per_position_vs_f64: float
    per_position_vs_f64: list[float]
    rel_floor_vs_f64: float
    rel_per_position_floor_vs_f64: float
    per_position_floor_vs_f64: list[float]
    over_floor: float
    over_floor_per_position: float


def half_figures(out: torch.Tensor, exact: torch.Tensor, half: torch.Tensor) -> HalfFigures:
    """The HalfFigures of a half mode's hidden states `out`, against float64 `exact` beside float16 `half`."""
    mode = compare.figures("vs_f64", out, exact, curve=True)
    floor = compare.figures("floor_vs_f64", half, exact, curve=True)
    return HalfFigures(
        **mode,
        **floor,
        over_floor=ratio(mode["rel_vs_f64"], floor["rel_floor_vs_f64"]),
        over_floor_per_position=ratio(mode["rel_per_position_vs_f64"], floor["rel_per_position_floor_vs_f64"]),
    )


def ratio(error: float, floor: float) -> float:
    """error / floor; NaN where either is not finite, so that a bound on it fails."""
    if not (math.isfinite(error) and math.isfinite(floor)):
        return float("nan")
    return error / max(floor, 1e-30)


def finite(outputs: dict) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in outputs.values())


LIMITS = ("max_rel_fp32", "max_rel_per_position_fp32", "fp16_max_over_floor")


@dataclass(frozen=True)
class GpuBounds:
    """params.yaml `verify_gpu`'s bounds: fp32's against the torch graph (global and per position), a half
    mode's ratio to the torch float16 floor, and the half modes that ratio fails the stage for."""

    max_rel_fp32: float
    max_rel_per_position_fp32: float
    fp16_max_over_floor: float
    held_to_floor: tuple[str, ...] = ()


def limits(section) -> GpuBounds:
    """params.yaml `verify_gpu` -> its GpuBounds, each bound a positive number and held_to_floor a
    subset of the half modes."""
    bounds = params.positive_numbers(section, LIMITS, "verify_gpu")
    held = section.get("held_to_floor", []) if isinstance(section, dict) else []
    return GpuBounds(**bounds, held_to_floor=tuple(params.subset_of(*HALF_MODES)(held, "verify_gpu.held_to_floor")))


def section_bytes(section, fp32_stack_bytes: int, tokens: int) -> int:
    """The most constant bytes the accelerator is given at once (scripts/litert/sections.py), for a
    graph whose longest signature takes `tokens`: params.yaml verify_gpu.section_fraction x the stack's
    fp32 bytes (memory), but never under verify_gpu.section_min_bytes (what the accelerator holds of a
    section that small fits in the stage's memory overhead: a small graph runs whole), and at most
    verify_gpu.section_work / tokens (a run's time)."""
    found = section if isinstance(section, dict) else {}
    fraction = params.positive_number(found.get("section_fraction"), "verify_gpu.section_fraction")
    least = params.positive_number(found.get("section_min_bytes"), "verify_gpu.section_min_bytes")
    work = params.positive_number(found.get("section_work"), "verify_gpu.section_work")
    return max(1, int(min(max(fraction * fp32_stack_bytes, least), work / tokens)))


class ModeRun:
    """One mode of the GPU accelerator over a graph cut into sections (sections.SectionedGraph):
    `run(signature, feeds)` -> one output dict per feed, each section compiled once for the batch.
    Records whether every section compiled was fully accelerated, the device, and `seconds`: the wall
    time spent compiling for the accelerator and running on it (feeding and reading included), the
    part of the stage a faster GPU shortens."""

    def __init__(self, graph, mode: str, census: dict | None = None):
        self.graph, self.mode, self.census = graph, mode, census
        self.fully_accelerated, self.device, self.seconds, self.proof = True, None, 0.0, None

    def compile(self, path):
        c = gpu_accelerator.compile(path, self.mode, self.census)
        self.fully_accelerated &= c.fully_accelerated
        self.device = self.device or gpu_accelerator.device(c)
        return c

    def gate(self) -> None:
        """Show the mode by its effect (gpu_accelerator.prove_mode: the precision probe), then compile
        the graph's smallest section in it, before any torch work: no adapter, a mode the runtime
        ignores or a mode the device cannot set up is a ClefError here. Every section is compiled again when it runs
        (once per batch), where an op the accelerator refuses is a ClefError naming it: compiling every
        section here as well would double the compiles, most of the stage's time on a software GPU."""
        start = time.perf_counter()
        self.proof = gpu_accelerator.prove_mode(self.mode)
        smallest = min(
            (s for name in self.graph.plans for s in self.graph.sections(name)), key=lambda s: s.constant_bytes
        )
        self.compile(smallest.path).close()
        self.seconds += time.perf_counter() - start

    def __call__(self, signature: str, feeds: list[dict]) -> list[dict]:
        start = time.perf_counter()
        try:
            where = f"{self.graph.path.stem} {signature}"
            return self.graph.run(self.compile, signature, feeds, progress=f"GPU {self.mode}: {where}")
        finally:
            self.seconds += time.perf_counter() - start


# Each check in two halves: its torch references first (while the stack is loaded), then its rows from
# the compiled graph (after the stack is freed), so the weights are never in memory twice.


@dataclass(frozen=True)
class HiddenReferences:
    """A record's hidden states [n, H] that a GPU mode's are held against: the torch graph's (fp32's
    reference), stock float64's (the half modes') and stock float16's (their floor)."""

    graph: torch.Tensor
    exact: torch.Tensor
    half: torch.Tensor


RowReferences = dict[str, HiddenReferences]
"""A row graph's records' HiddenReferences by kind (row_references)."""


@dataclass(frozen=True)
class ChainingReferences(HiddenReferences):
    """HiddenReferences at the suffix positions of one chaining: prefix length p, suffix length s,
    and the p + s token ids."""

    p: int
    s: int
    ids: list[int]


def row_references(model, host: Host, stock: StockReferences, records: RowRecords) -> RowReferences:
    """records: {kind: (n, inputs)} -> {kind: its HiddenReferences}."""
    length = next(iter(records.values()))[1]["valid"].shape[-1]
    graph = ClefRowPrefill(model, length).eval()
    out = {}
    for kind, (n, inputs) in records.items():
        with torch.no_grad(), profile.part("torch"):
            ref = graph(**inputs)["hidden"][0, :n]
        exact, half = stock.hidden(inputs["embeds"][:, :n])
        out[kind] = HiddenReferences(ref, exact, half)
    return out


def row_rows(runs: dict, references: RowReferences, records: RowRecords) -> list[dict]:
    """One row per record and mode (`references` from row_references); runs: {mode: run(signature,
    feeds) -> outputs per feed}, e.g. a ModeRun."""
    rows = []
    kinds = list(records)
    for mode, run in runs.items():
        outputs = run(DEFAULT_SIGNATURE, [records[kind][1] for kind in kinds])
        for kind, outs in zip(kinds, outputs, strict=True):
            n, ref = records[kind][0], references[kind]
            out = outs["hidden"][0, :n]
            row = {
                "mode": mode,
                "record": kind,
                "n_real": n,
                "finite": finite(outs),
                **compare.figures("vs_torch", out, ref.graph, curve=True),
            }
            if mode in HALF_MODES:
                row.update(half_figures(out, ref.exact, ref.half).to_json())
            rows.append(row)
    return rows


@dataclass(frozen=True)
class SignatureReferences:
    """The signature check's torch side: the prefix's p real tokens (`ids`), and each signature's
    inputs and torch outputs, the suffix's inputs holding the torch prefix's state."""

    p: int
    ids: list[int]
    prefix: tuple[Tensors, Tensors]
    suffix: tuple[Tensors, Tensors]


def signature_references(prefix_module, suffix_module, host: Host, P: int, S: int, ids, p: int) -> SignatureReferences:
    """Each signature's inputs and torch outputs: the prefix on ids[:p], the suffix on ids[p:p+S] fed the
    torch prefix's state."""
    prefix_in = host.record(ids[:p], P)
    with torch.no_grad():
        ref_prefix = dict(prefix_module(**prefix_in))
    state = {k: v for k, v in ref_prefix.items() if k != "hidden"}
    suffix_in = {**host.record(ids[p : p + S], S, start=p), **state}
    with torch.no_grad():
        ref_suffix = dict(suffix_module(**suffix_in))
    return SignatureReferences(p, list(ids[:p]), (prefix_in, ref_prefix), (suffix_in, ref_suffix))


def chaining_references(
    model, host: Host, stock: StockReferences, P: int, S: int, tokens: dict[int, list[int]]
) -> list[ChainingReferences]:
    """tokens: {p: p + S token ids} for each prefix length p -> for each p and s, the tokens
    tokens[p][:p + s] and, at the suffix positions, the row graph's hidden (torch), stock float64 and
    float16. Both suffixes of a p share its prefix, so the GPU runs each prefix once."""
    row = ClefRowPrefill(model, P + S).eval()
    out = []
    _, suffixes = records.chaining_lengths(P, S)
    for p in sorted(tokens):
        for s in suffixes:
            ids = list(tokens[p][: p + s])
            full = host.record(ids, P + S)
            with torch.no_grad():
                ref = row(**full)["hidden"][0, p : p + s]
            exact, half = stock.hidden(full["embeds"][:, : p + s])
            out.append(ChainingReferences(ref, exact[p:], half[p:], p=p, s=s, ids=ids))
    return out


@dataclass(frozen=True)
class SignatureRow(Record):
    """One pair signature run alone in a GPU mode against torch (a row of results/gpu_*.json as
    `to_json()`): whether its outputs are finite, the worst of its outputs' figures, and each output's."""

    mode: str
    check: str
    signature: str
    p: int
    finite: bool
    rel_vs_torch: float | None
    rel_per_position_vs_torch: float | None
    per_output: dict[str, dict[str, float]]


def _signature_row(mode: str, name: str, p: int, outs: Tensors, ref: Tensors) -> SignatureRow:
    """One signature's outputs vs torch's, every output, worst over them."""
    per_output = {k: compare.figures("vs_torch", outs[k], ref[k], pair_graph.position_dim(k)) for k in ref}
    return SignatureRow(
        mode=mode,
        check="signature",
        signature=name,
        p=p,
        finite=finite(outs),
        rel_vs_torch=compare.worst(per_output.values(), "rel_vs_torch"),
        rel_per_position_vs_torch=compare.worst(per_output.values(), "rel_per_position_vs_torch"),
        per_output=per_output,
    )


def pair_rows(
    runs: dict,
    host: Host,
    signature: SignatureReferences,
    chaining: list[ChainingReferences],
    P: int,
    S: int,
    form: str,
    state_shapes: dict,
) -> list[dict]:
    """Per mode, two batches on the GPU: every distinct prefix, then one suffix per prefix.
    - signature (signature_references): each signature alone vs torch, the suffix fed torch's state;
    - chaining (chaining_references): suffix(prefix(x[:p]), x[p:p+s]) vs the row graph (fp32) and stock
      float64 (fp16).
    A chaining prefix on the signature check's tokens is the signature check's prefix run, not a second
    run; a chaining suffix of s tokens is the head of the longest suffix on its prefix (a real position
    is blind to what follows it, as scripts/checks/pair_check.py's rows are), not a run of its own. The
    references stay computed per s, so the head is held to each independently."""
    rows = []
    pair = PairRunner(host, None, None, P, S, form, state_shapes)
    longest = {}  # p -> the ids of its longest chaining suffix
    for ref in chaining:
        if len(ref.ids) > len(longest.get(ref.p, ())):
            longest[ref.p] = ref.ids
    prefix_feeds = {tuple(signature.ids): signature.prefix[0]}
    for p, ids in longest.items():
        prefix_feeds.setdefault(tuple(ids[:p]), None)
    keys = list(prefix_feeds)
    for ref in chaining:
        if list(longest[ref.p][: len(ref.ids)]) != list(ref.ids):
            raise ValueError(f"chaining tokens for p={ref.p}, s={ref.s} are not the head of its longest suffix's")
    for mode, run in runs.items():
        feeds = [prefix_feeds[k] if prefix_feeds[k] is not None else pair.prefix_inputs(list(k)) for k in keys]
        prefixes = dict(zip(keys, run("prefix", feeds), strict=True))
        first = prefixes[tuple(signature.ids)]
        rows.append(_signature_row(mode, "prefix", signature.p, first, signature.prefix[1]).to_json())
        states = {p: pair.prefix_result(dict(prefixes[tuple(ids[:p])]), p) for p, ids in longest.items()}
        *suffixes, alone = run(
            "suffix",
            [*(pair.suffix_inputs(states[p][1], ids[p:]) for p, ids in longest.items()), signature.suffix[0]],
        )
        rows.append(_signature_row(mode, "suffix", signature.p, alone, signature.suffix[1]).to_json())
        suffixes = dict(zip(longest, suffixes, strict=True))
        for ref in chaining:
            (prefix_hidden, state), outs = states[ref.p], suffixes[ref.p]
            p, s = ref.p, ref.s
            out = outs["hidden"][0, :s]
            r = {
                "mode": mode,
                "check": "chaining",
                "p": p,
                "s": s,
                "prefix_padded": p < P,
                "finite": bool(torch.isfinite(out).all() and torch.isfinite(prefix_hidden).all())
                and finite(state.tensors),
                **compare.figures("vs_torch", out, ref.graph, curve=True),
            }
            if mode in HALF_MODES:
                r.update(half_figures(out, ref.exact, ref.half).to_json())
            rows.append(r)
    return rows


@dataclass
class ModeFigures:
    """One mode's worst figures over a graph's rows (None where the mode has none): fp32 against the
    torch graph; a half mode against stock float64, beside the floor and its ratio to it."""

    mode: str
    rows: int
    all_finite: bool
    max_rel_vs_torch: float | None
    max_rel_per_position_vs_torch: float | None
    max_rel_vs_f64: float | None = None
    max_rel_per_position_vs_f64: float | None = None
    floor_max_rel_vs_f64: float | None = None
    floor_max_rel_per_position_vs_f64: float | None = None
    over_floor: float | None = None
    over_floor_per_position: float | None = None
    target_over_floor: float | None = None
    within_target: bool | None = None
    enforced: bool = False


def mode_figures(rows: list[dict], mode: str, over_floor: float, held: list[str]) -> ModeFigures:
    mine = [r for r in rows if r["mode"] == mode]
    figs = ModeFigures(
        mode,
        len(mine),
        all(r["finite"] for r in mine),
        compare.worst(mine, "rel_vs_torch"),
        compare.worst(mine, "rel_per_position_vs_torch"),
    )
    if mode in HALF_MODES:
        figs.max_rel_vs_f64 = compare.worst(mine, "rel_vs_f64")
        figs.max_rel_per_position_vs_f64 = compare.worst(mine, "rel_per_position_vs_f64")
        figs.floor_max_rel_vs_f64 = compare.worst(mine, "rel_floor_vs_f64")
        figs.floor_max_rel_per_position_vs_f64 = compare.worst(mine, "rel_per_position_floor_vs_f64")
        figs.over_floor = compare.worst(mine, "over_floor")
        figs.over_floor_per_position = compare.worst(mine, "over_floor_per_position")
        figs.target_over_floor = over_floor
        figs.within_target = not (
            compare.exceeds(figs.over_floor, over_floor) or compare.exceeds(figs.over_floor_per_position, over_floor)
        )
        figs.enforced = mode in held
    return figs


def position_curves(rows: list[dict]) -> dict[str, str | list[float]] | None:
    """Each mode's error at every position of one record, for the pictures (scripts/pipeline/pictures.py):
    the shape of the graph's reference record (a row's right-padded record; a pair's chaining of the
    longest suffix after the shared prefix). -> {"record": its name, "<mode>_vs_torch": fp32's figures,
    "<mode>_vs_f64": a half mode's, "floor_vs_f64": torch float16's}; None without such a row."""
    drawn = [r for r in rows if "per_position_vs_torch" in r and r.get("check", "chaining") == "chaining"]
    if not drawn:
        return None
    longest = max((r.get("s", 0), r.get("p", 0)) for r in drawn)
    drawn = [r for r in drawn if (r.get("s", 0), r.get("p", 0)) == longest]
    first = drawn[0]
    curves = {
        "record": f"p={first['p']}, s={first['s']}" if "s" in first else f"{first['record']} ({first['n_real']} real)"
    }
    for r in drawn:
        if r["mode"] in HALF_MODES:
            curves[f"{r['mode']}_vs_f64"] = r["per_position_vs_f64"]
            curves["floor_vs_f64"] = r["per_position_floor_vs_f64"]
        else:
            curves[f"{r['mode']}_vs_torch"] = r["per_position_vs_torch"]
    return curves


def summary(rows: list[dict], bounds: GpuBounds) -> tuple[dict, list[str]]:
    """Headline figures and the problems, one line each: not finite, fp32 over a bound (global or per
    position), a half mode of bounds.held_to_floor over fp16_max_over_floor x the floor (global or
    per position). The other half modes' ratios are recorded against the same target. `modes` holds
    every mode's ModeFigures; the flat keys are fp32's and fp16's, as earlier records have them."""
    over_floor, held = bounds.fp16_max_over_floor, bounds.held_to_floor
    fp32 = [r for r in rows if r["mode"] == "fp32"]
    problems = compare.judge([r for r in rows if r["mode"] != "fp32" and r["mode"] not in held], {})
    problems += compare.judge(
        fp32, {"rel_vs_torch": bounds.max_rel_fp32, "rel_per_position_vs_torch": bounds.max_rel_per_position_fp32}
    )
    problems += compare.judge(
        [r for r in rows if r["mode"] in held], {"over_floor": over_floor, "over_floor_per_position": over_floor}
    )
    modes = {m: mode_figures(rows, m, over_floor, held) for m in dict.fromkeys(r["mode"] for r in rows)}
    fp16 = modes.get("fp16")
    doc = {
        "fp32_max_rel_vs_torch": compare.worst(fp32, "rel_vs_torch"),
        "fp32_max_rel_per_position_vs_torch": compare.worst(fp32, "rel_per_position_vs_torch"),
        "fp16_max_rel_vs_f64": fp16 and fp16.max_rel_vs_f64,
        "fp16_max_rel_per_position_vs_f64": fp16 and fp16.max_rel_per_position_vs_f64,
        "floor_max_rel_vs_f64": compare.worst([r for r in rows if "rel_floor_vs_f64" in r], "rel_floor_vs_f64"),
        "floor_max_rel_per_position_vs_f64": compare.worst(
            [r for r in rows if "rel_per_position_floor_vs_f64" in r], "rel_per_position_floor_vs_f64"
        ),
        "fp16_over_floor": fp16 and fp16.over_floor,
        "fp16_target_over_floor": over_floor,
        "fp16_within_target": bool(fp16 and fp16.within_target),
        "all_finite": all(r["finite"] for r in rows),
        "modes": {m: asdict(f) for m, f in modes.items()},
        "positions": position_curves(rows),
    }
    return doc, problems
