"""Kernel-level verification: every form's chunk kernel against float64 truth and the stock kernel.

Five input regimes, each a way the chunked delta rule can go wrong:
  strong_decay     random keys, g in [-3, -0.05]: decays underflow inside a chunk;
  weak_decay       random keys, g in [-0.02, 0]: the state carries across many chunks;
  correlated_keys  one shared direction + 0.3 noise, weak decay: an ill-conditioned inverse;
  one_key          one key for every token, no decay: the in-chunk inverse at its worst (every pair
                   interacts);
  gate_extremes    g = -A softplus(a + dt_bias) with a in [-20, 20], computed in the run's own dtype
                   through the form's softplus, as a GPU runs the layer in fp16: exp(a) overflows
                   fp16 past a ~ 11, which `sp` avoids and `ec` contains.
The configured form must stay finite in fp16 in all. (Regime names are words so that they cannot be
read as the form's R<n> chunk part.)
q and k are drawn with the checkpoint's key-head count and interleaved to the value-head count, so
head pairs are identical as in clef-flash. The truth is the token-by-token recurrence in float64.
Errors: scripts/checks/compare.py (global, and per position for the output).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from scripts.checks import compare
from scripts.layers import gated_delta, kernel_form
from scripts.pipeline.records import Record

REGIMES = ("strong_decay", "weak_decay", "correlated_keys", "one_key", "gate_extremes")
GATE_A_MAX = 20.0  # gate_extremes's |a|: exp(20) ~ 5e8 is far past fp16's 65504
LENGTHS = (256, 130, 200)  # 130 and 200 leave a tail that is not a multiple of any chunk
INIT_STATE_STD = 0.1


def regime_inputs(name: str, length: int, seed: int, hk: int, hv: int, dk: int, dv: int, initial_state: bool):
    """(q, k, v, g, beta, s0) for one regime; q/k drawn with hk heads and interleaved to hv."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, length, hk, dk, generator=gen)
    if name in ("strong_decay", "weak_decay", "gate_extremes"):
        k = torch.randn(1, length, hk, dk, generator=gen)
    elif name == "correlated_keys":
        u = torch.randn(1, 1, hk, dk, generator=gen)
        k = u / u.norm(dim=-1, keepdim=True) * dk**0.5 + 0.3 * torch.randn(1, length, hk, dk, generator=gen)
    elif name == "one_key":
        k = torch.randn(1, 1, hk, dk, generator=gen).expand(1, length, hk, dk).contiguous()
    else:
        raise ValueError(name)
    v = torch.randn(1, length, hv, dv, generator=gen)
    if name == "strong_decay":
        beta = 0.2 + 0.7 * torch.rand(1, length, hv, generator=gen)
        g = -(0.05 + 2.95 * torch.rand(1, length, hv, generator=gen))
    elif name in ("weak_decay", "correlated_keys"):
        beta = 0.2 + 0.7 * torch.rand(1, length, hv, generator=gen)
        g = -0.02 * torch.rand(1, length, hv, generator=gen)
    elif name == "gate_extremes":
        beta = 0.2 + 0.7 * torch.rand(1, length, hv, generator=gen)
        g = Gate(
            a=GATE_A_MAX * (2 * torch.rand(1, length, hv, generator=gen) - 1),
            A=1.0 + 15.0 * torch.rand(hv, generator=gen),
            dt_bias=2 * torch.rand(hv, generator=gen) - 1,
        )
    else:
        beta = torch.full((1, length, hv), 0.5)
        g = torch.zeros(1, length, hv)
    s0 = INIT_STATE_STD * torch.randn(1, hv, dk, dv, generator=gen) if initial_state else None
    r = hv // hk
    q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    return q, k, v, g, beta, s0


@dataclass(frozen=True)
class Gate:
    """gate_extremes's g before it is computed: g = -A softplus(a + dt_bias), evaluated in the dtype of the run."""

    a: torch.Tensor  # [B, L, H]
    A: torch.Tensor  # [H]
    dt_bias: torch.Tensor  # [H]

    def to(self, dtype, softplus=None) -> torch.Tensor:
        """softplus None: log(1 + e^x) op by op, each result rounded to `dtype` as a delegate computes
        it (torch's fused F.softplus keeps fp32 inside on CPU, so it cannot show fp16 overflowing)."""
        a, A, dt_bias = (x.to(dtype) for x in (self.a, self.A, self.dt_bias))
        x = a + dt_bias
        if softplus is None:
            return -A * (F.softplus(x) if dtype == torch.float64 else torch.log1p(torch.exp(x)))
        return -A * softplus(x)


def run_form(form, inputs, dtype=torch.float32, scaled_state=True, kernel=None):
    """A form's kernel (or `kernel`, a variant of it) on `inputs` in `dtype`; -> (out, state) divided
    back by 2^vs, in float64.

    Under vs<k> the state passed in is scaled by 2^k (the contract) unless scaled_state is False
    (the control: the wrong contract)."""
    q, k, v, g, beta, s0 = inputs
    scale = form.v_scale
    if s0 is not None and scaled_state:
        s0 = s0 * scale
    if isinstance(g, Gate):  # gate_extremes: the gate in the run's dtype through the form's softplus
        g = g.to(dtype, gated_delta.safe_softplus if form.sp else None)
    cast = [None if x is None else x.to(dtype) for x in (q, k, v, g, beta, s0)]
    out, state = (kernel or gated_delta.make_kernel(form))(
        *cast[:5], initial_state=cast[5], output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    return out.to(torch.float64) / scale, state.to(torch.float64) / scale


def finite(*xs) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in xs)


def form_figures(out, state, out_ref, state_ref, what: str) -> dict[str, float]:
    """The output (global and per position: positions are axis 1 of [B, L, H, Dv]) and the state
    (global: it has no positions) of one kernel run against a reference."""
    return {
        **compare.figures(what, out, out_ref, position_dim=1),
        **compare.figures(f"state_{what}", state, state_ref, position_dim=None),
    }


def check(heads: dict, forms: list, seed: int = 0, control_form: str | None = None) -> list[dict]:
    """One row per (regime, L, initial state): stock and every form, fp32 and fp16; for `control_form`
    also the memory-cut control (scripts/checks/controls.py) against the same truth."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as stock_kernel

    rows = []
    case = 0
    for name in REGIMES:
        for length in LENGTHS:
            for init in (False, True):
                case += 1
                inputs = regime_inputs(
                    name, length, seed + case, heads["k"], heads["v"], heads["k_dim"], heads["v_dim"], init
                )
                q, k, v, g, beta, s0 = inputs
                # gate_extremes's gate exact in float64
                out_t, state_t = gated_delta.recurrence_f64(q, k, v, g, beta, s0)
                if isinstance(g, Gate):
                    g = g.to(torch.float32)
                out_s, state_s = stock_kernel(
                    q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
                )
                row = {
                    "regime": name,
                    "L": length,
                    "initial_state": init,
                    "head_pairs_identical": bool(torch.equal(q[:, :, 0::2], q[:, :, 1::2])),
                    "stock": {
                        **form_figures(out_s, state_s, out_t, state_t, "vs_f64"),
                        "finite": finite(out_s, state_s),
                    },
                    "forms": {},
                }
                for text in forms:
                    form = kernel_form.parse(text)
                    out, state = run_form(form, inputs)
                    out16, state16 = run_form(form, inputs, dtype=torch.float16)
                    entry = {
                        **form_figures(out, state, out_t, state_t, "vs_f64"),
                        **form_figures(out, state, out_s.double(), state_s.double(), "vs_stock"),
                        "finite": finite(out, state),
                        "fp16": {
                            "finite": finite(out16, state16),
                            **form_figures(out16, state16, out_t, state_t, "vs_f64"),
                        },
                    }
                    if init and form.vs:
                        wrong, _ = run_form(form, inputs, scaled_state=False)
                        entry["control_unscaled_state_rel_vs_f64"] = compare.rel(wrong, out_t)
                    if str(form) == control_form:
                        cut, cut_state = run_form(form, inputs, kernel=gated_delta.make_kernel(form, carry_state=False))
                        entry["control_memory_cut"] = form_figures(cut, cut_state, out_t, state_t, "vs_f64")
                    row["forms"][str(form)] = entry
                rows.append(row)
    return rows


BOUNDED = ("rel_vs_f64", "rel_per_position_vs_f64", "rel_state_vs_f64")


@dataclass(frozen=True)
class WorstVsF64(Record):
    """A kernel's largest error against float64 truth over every row: output, output per position, state."""

    out: float | None
    out_per_position: float | None
    state: float | None


@dataclass(frozen=True)
class WorstVsStock(Record):
    """A form's largest error against the stock kernel over every row: output and state."""

    out: float | None
    state: float | None


@dataclass(frozen=True)
class Fp16Figures(Record):
    """A form run in float16 over every row: finite everywhere, and its largest errors against float64."""

    all_finite: bool
    max_out_rel_vs_f64: float | None
    max_out_rel_per_position_vs_f64: float | None
    max_state_rel_vs_f64: float | None


@dataclass(frozen=True)
class MemoryCutControl(Record):
    """The configured form with its state zeroed at each chunk boundary: its largest error against
    float64, how many times the bound that is, and how many times it must be."""

    rel_vs_f64: float | None
    over_threshold: float | None
    required_over_threshold: float
    what: str


@dataclass(frozen=True)
class KernelSummary(Record):
    """results/kernel.json `summary`: the configured form judged against its bounds, and every form's
    worst figures (fp32 and fp16, against float64 and the stock kernel) beside the stock kernel's."""

    form: str
    thresholds: dict[str, float]
    passed: bool
    failures: list[str]
    max_rel_vs_f64: dict[str, WorstVsF64]
    max_rel_vs_stock: dict[str, WorstVsStock]
    stock_max_rel_vs_f64: WorstVsF64
    all_finite: bool
    head_pairs_identical: bool
    fp16: dict[str, Fp16Figures]
    fp16_note: str
    control_memory_cut: MemoryCutControl
    vs_control_unscaled_state_min_out_rel_vs_f64: float | None


@dataclass(frozen=True)
class KernelRecord(Record):
    """results/kernel.json: the checkpoint's GatedDeltaNet head counts, its revision, the summary and
    every row (regime, L, initial state) of check."""

    heads: dict[str, int]
    revision: str
    summary: KernelSummary
    rows: list[dict]


FP16_NOTE = (
    "fp16 runs the kernel's own arithmetic in float16; `loop` is the stock algorithm op for op "
    "(transformers' stock function upcasts to float32 inside, so it cannot show fp16). The "
    "configured form must be finite in fp16 in every regime."
)


def summarize(rows: list[dict], form: str, limits: dict[str, float], min_over: float) -> KernelSummary:
    """limits: {"rel_vs_f64", "rel_per_position_vs_f64"} bounds; the state is held to the global one.
    Failures: the configured form over a bound or not finite, in fp32; not finite in fp16 in any
    regime (`sp` and `ec` exist for that); its memory-cut control under min_over x the global bound."""
    forms = list(rows[0]["forms"])
    bounds = {**limits, "rel_state_vs_f64": limits["rel_vs_f64"]}

    def worst(key, f, sub=None):
        return compare.worst([(r["forms"][f][sub] if sub else r["forms"][f]) for r in rows], key)

    def labelled(r, entry):
        return {"check": form, "regime": r["regime"], "L": r["L"], "initial_state": r["initial_state"], **entry}

    failures = compare.judge(
        [labelled(r, {k: r["forms"][form][k] for k in (*BOUNDED, "finite")}) for r in rows], bounds
    )
    failures += [
        f"{compare.where(labelled(r, {}))}not finite in fp16" for r in rows if not r["forms"][form]["fp16"]["finite"]
    ]
    cut = [
        labelled(r, r["forms"][form]["control_memory_cut"]) for r in rows if "control_memory_cut" in r["forms"][form]
    ]
    control = compare.worst(cut, "rel_vs_f64")
    failures += compare.control_problems("memory_cut", control, limits["rel_vs_f64"], min_over)
    stock = [r["stock"] for r in rows]
    return KernelSummary(
        form=form,
        thresholds=bounds,
        passed=not failures,
        failures=failures,
        max_rel_vs_f64={
            f: WorstVsF64(
                out=worst("rel_vs_f64", f),
                out_per_position=worst("rel_per_position_vs_f64", f),
                state=worst("rel_state_vs_f64", f),
            )
            for f in forms
        },
        max_rel_vs_stock={
            f: WorstVsStock(out=worst("rel_vs_stock", f), state=worst("rel_state_vs_stock", f)) for f in forms
        },
        stock_max_rel_vs_f64=WorstVsF64(
            out=compare.worst(stock, "rel_vs_f64"),
            out_per_position=compare.worst(stock, "rel_per_position_vs_f64"),
            state=compare.worst(stock, "rel_state_vs_f64"),
        ),
        all_finite=all(r["stock"]["finite"] for r in rows)
        and all(r["forms"][f]["finite"] for r in rows for f in forms),
        head_pairs_identical=all(r["head_pairs_identical"] for r in rows),
        fp16={
            f: Fp16Figures(
                all_finite=all(r["forms"][f]["fp16"]["finite"] for r in rows),
                max_out_rel_vs_f64=worst("rel_vs_f64", f, "fp16"),
                max_out_rel_per_position_vs_f64=worst("rel_per_position_vs_f64", f, "fp16"),
                max_state_rel_vs_f64=worst("rel_state_vs_f64", f, "fp16"),
            )
            for f in forms
        },
        fp16_note=FP16_NOTE,
        control_memory_cut=MemoryCutControl(
            rel_vs_f64=control,
            over_threshold=compare.margin(control, limits["rel_vs_f64"]),
            required_over_threshold=min_over,
            what="the configured form with its state zeroed at every chunk boundary",
        ),
        vs_control_unscaled_state_min_out_rel_vs_f64=min(
            [
                r["forms"][f]["control_unscaled_state_rel_vs_f64"]
                for r in rows
                for f in forms
                if "control_unscaled_state_rel_vs_f64" in r["forms"][f]
            ],
            default=None,
        ),
    )


def export_nodes(fn, args) -> int:
    """Call nodes of the torch.export graph of kernel `fn` on `args`."""

    class Wrap(torch.nn.Module):
        def forward(self, q, k, v, g, beta):
            return fn(q, k, v, g, beta, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)

    ep = torch.export.export(Wrap(), args)
    return sum(1 for n in ep.graph.nodes if n.op == "call_function")


def median_seconds(fns, args, repeats: int) -> list[float]:
    """Median wall time of each fn on args; the fns take turns in every round, so a slow spell of
    this shared machine hits them alike."""
    kwargs = {"output_final_state": True, "use_qk_l2norm_in_kernel": True}
    times = [[] for _ in fns]
    with torch.no_grad():
        for fn in fns:
            fn(*args, **kwargs)  # warm-up
        for _ in range(repeats):
            for fn, bucket in zip(fns, times, strict=True):
                t0 = time.perf_counter()
                fn(*args, **kwargs)
                bucket.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


@dataclass(frozen=True)
class BenchRow(Record):
    """One length of the kernel bench: both kernels' median seconds, their ratio, export node counts."""

    L: int
    stock_median_s: float
    form_median_s: float
    speedup_stock_over_form: float
    export_nodes_stock: int
    export_nodes_form: int


@dataclass(frozen=True)
class KernelBench(Record):
    """results/kernel_bench.json: the form's kernel against the stock one at given head sizes."""

    form: str
    heads: int
    head_dim: int
    repeats: int
    torch_threads: int
    rows: list[BenchRow]


def bench(form: str, heads: int, head_dim: int, lengths, repeats: int) -> KernelBench:
    """The form's kernel vs transformers' stock kernel: median time ratio and export node counts."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as stock_kernel

    kernel = gated_delta.make_kernel(kernel_form.parse(form))
    rows = []
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        args = (
            torch.randn(1, length, heads, head_dim, generator=gen),
            torch.randn(1, length, heads, head_dim, generator=gen),
            torch.randn(1, length, heads, head_dim, generator=gen),
            -torch.rand(1, length, heads, generator=gen),
            torch.rand(1, length, heads, generator=gen),
        )
        t_stock, t_form = median_seconds([stock_kernel, kernel], args, repeats)
        rows.append(
            BenchRow(
                L=length,
                stock_median_s=t_stock,
                form_median_s=t_form,
                speedup_stock_over_form=t_stock / t_form,
                export_nodes_stock=export_nodes(stock_kernel, args),
                export_nodes_form=export_nodes(kernel, args),
            )
        )
    return KernelBench(
        form=form,
        heads=heads,
        head_dim=head_dim,
        repeats=repeats,
        torch_threads=torch.get_num_threads(),
        rows=rows,
    )
