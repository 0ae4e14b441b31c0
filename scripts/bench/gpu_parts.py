"""Where LiteRT's GPU accelerator loses precision in fp16 mode, part by part, and what a form change buys.

Each part of the first GatedDeltaNet (real inputs: the tiny checkpoint, form R64+sp+ec+dd+vs6, a
random record) is converted alone, compiled for the GPU accelerator (scripts.litert.gpu_accelerator) in fp16
and fp32, and compared with the same part in torch float64 and torch float16 on the same inputs. One-op
graphs then isolate the ops, and before/after graphs measure the proposed fix on one layer and the
whole L=64 row graph against stock float64.

Found: FULLY_CONNECTED (and BATCH_MATMUL, CONV_2D) accumulate in fp16, one accumulator over K in order
(reproduced bit for bit in torch), ~8x a single rounding at K=128 and growing with K; SUM and MEAN
accumulate in fp32. The GatedDeltaNet magnifies the projections' q/k errors where a core is near zero.
LOG(1 + y), which log1p lowers to, returns 0 in fp16 for y < 2^-11 (wrong small decays; no measurable
effect on this checkpoint). The fix prototyped here: projections summed in slices of 8 products
(BATCH_MATMUL + SUM, form part sk8) and log1p by a series. Also recorded, not part of the fix: the
RMSNorm's folded (1 + w) constant is rounded to fp16 on the GPU. Writes results/gpu_parts.json.

    cd /work/main && .venv/bin/python -m scripts.bench.gpu_parts
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scripts.checkpoint import snapshot
from scripts.checks import compare, model_check, record_text
from scripts.layers import gated_delta, kernel_form
from scripts.litert import export, gpu_accelerator
from scripts.pipeline import atomic
from scripts.pipeline.records import Record, keyed, optional
from scripts.qwen35 import patch
from scripts.qwen35.host import Host
from scripts.qwen35.row_graph import ClefRowPrefill

OUT = Path("results/gpu_parts.json")
SCRATCH = Path(".")  # main() points it at a temporary directory for the converted part graphs
FORM = "R64+sp+ec+dd+vs6"
PART_L, PART_SEED = 256, 0  # the parts' record: 4 chunks, so the inter-chunk recurrence runs
MODEL_L, MODEL_SEEDS = 64, tuple(range(8))
SK_WIDTH = 8
rel = compare.rel
ADAPTER: dict[str, str] = {}


def sig(x: float) -> float:
    return float(f"{x:.4g}")


# ---------------------------------------------------------------------------------------------
# the proposed fix, as a runtime prototype (the same formulas as the proposed clef_kernel changes)


def log1p_softplus(x: torch.Tensor) -> torch.Tensor:
    """`sp` as it was when this benchmark ran: torch.log1p, which LiteRT runs as LOG(1 + y)."""
    return torch.clamp_min(x, 0.0) + torch.log1p(torch.exp(-torch.abs(x)))


series_softplus = gated_delta.safe_softplus  # the series, adopted into `sp` since


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, bias, width: int) -> torch.Tensor:
    """x @ W^T with K in K/width slices: one BATCH_MATMUL [P, M, w] @ [P, w, N], the slices added by one SUM."""
    n, k = weight.shape
    if k <= width or k % width:
        return F.linear(x, weight, bias)
    parts = k // width
    xs = x.reshape(-1, parts, width).transpose(0, 1)
    ws = weight.reshape(n, parts, width).permute(1, 2, 0)
    y = (xs @ ws).sum(0).reshape(*x.shape[:-1], n)
    return y if bias is None else y + bias


class SplitK(nn.Module):
    def __init__(self, linear: nn.Linear, width: int):
        super().__init__()
        self.weight, self.bias, self.width = linear.weight, linear.bias, width

    def forward(self, x):
        return split_k_linear(x, self.weight, self.bias, self.width)


def with_fix(model: nn.Module, width: int = SK_WIDTH) -> nn.Module:
    """In place: split-K for every GatedDeltaNet's projections and every MLP (the series softplus is the
    form's `sp` now, carried by its kernel)."""
    for m in list(model.modules()):
        if isinstance(m, (patch.ClefGatedDeltaNet, patch.modeling.Qwen3_5MLP)):
            for name, child in list(m.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(m, name, SplitK(child, width))
    return model


# ---------------------------------------------------------------------------------------------
# running a part: GPU fp16 / fp32, torch float16, torch float64


def half(module: nn.Module) -> nn.Module:
    """A float16 copy; a GatedDeltaNet's g (mix computes it in fp32) enters its kernel as fp16."""
    m = copy.deepcopy(module).half()
    for gdn in gated_delta.gated_deltanets(m):
        inner = gdn.chunk_gated_delta_rule
        gdn.chunk_gated_delta_rule = lambda q, k, v, g, beta, _inner=inner, **kw: _inner(
            q, k, v, g=g.to(q.dtype), beta=beta, **kw
        )
    return m


@dataclasses.dataclass(frozen=True)
class GpuOutputs:
    """A part's outputs on the GPU accelerator in fp16 and fp32 mode, and the adapter it ran on."""

    fp16: dict[str, torch.Tensor]
    fp32: dict[str, torch.Tensor]
    adapter: str


def gpu_runs(module: nn.Module, inputs: dict[str, torch.Tensor], name: str) -> GpuOutputs:
    """The outputs of `module` converted and compiled alone, in fp16 and fp32 mode."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    path = SCRATCH / f"{name}.tflite"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        export.convert(module, {k: v.float() for k, v in inputs.items()}, path)
    out, adapter = {}, ""
    for mode, fp32 in (("fp16", False), ("fp32", True)):
        compiled = gpu_accelerator.compile(path, "fp32" if fp32 else "fp16")
        out[mode] = compiled.signature()(**{k: v.float() for k, v in inputs.items()})
        adapter = compiled.adapter
    return GpuOutputs(fp16=out["fp16"], fp32=out["fp32"], adapter=adapter)


@dataclasses.dataclass(frozen=True)
class MaxError(Record):
    """The largest error of torch float16, GPU fp16 and GPU fp32 against float64 (error_where)."""

    torch_fp16: float
    gpu_fp16: float
    gpu_fp32: float


@dataclasses.dataclass(frozen=True)
class FirstValues(Record):
    """An output's first element in float64, torch float16 and GPU fp16."""

    f64: float
    torch_fp16: float
    gpu_fp16: float


@dataclasses.dataclass(frozen=True)
class OutputFigures(Record):
    """One output of a part: GPU fp16, torch float16 and GPU fp32 against float64 (max |x - ref| / max |ref|)
    and float64's largest magnitude; then what some parts add: where |g| < 0.1 (how many, the largest
    absolute error there), the largest elementwise relative error, log1p's fp16 zeros, the share of
    FULLY_CONNECTED's outputs the sequential fp16 accumulation reproduces bit for bit, first values."""

    gpu_fp16_vs_f64: float
    torch_fp16_vs_f64: float
    gpu_fp32_vs_f64: float
    max_abs_f64: float
    small_g_count: int | None = optional()
    max_abs_err_where_small_g: MaxError | None = keyed("max_abs_err_where_abs_g_lt_0.1", optional=True)
    max_elementwise_rel: MaxError | None = optional()
    gpu_fp16_zero_up_to_x: float | None = optional()
    gpu_fp16_bitwise_equal_to_fp16_sequential_accumulation: float | None = optional()
    values: FirstValues | None = optional()


@dataclasses.dataclass(frozen=True)
class MixShares(Record):
    """The float64 mix's error fed one source's projections: all four, then each alone (the rest float64)."""

    all: float
    conv: float
    z: float
    beta: float
    a: float


@dataclasses.dataclass(frozen=True)
class MixAttribution(Record):
    """The GatedDeltaNet layer's float64 mix fed GPU fp16's projections, then torch float16's (mix_attribution)."""

    gpu_fp16: MixShares
    torch_fp16: MixShares


@dataclasses.dataclass(frozen=True)
class PartFigures(Record):
    """One part: what its inputs are, and per output (named by the part) its OutputFigures, beside
    `inputs` in the JSON; the GatedDeltaNet layer adds how much of its error the projections carry."""

    inputs: str
    outputs: dict[str, OutputFigures]
    mix_on_gpu_fp16_projections: MixAttribution | None = optional()

    def to_json(self) -> dict[str, Any]:
        doc = super().to_json()
        outputs = doc.pop("outputs")
        return {**doc, **outputs}

    @classmethod
    def from_json(cls, doc, where: str) -> PartFigures:
        if isinstance(doc, dict):
            named = {f.name for f in dataclasses.fields(cls)}
            doc = {
                **{k: v for k, v in doc.items() if k in named},
                "outputs": {k: v for k, v in doc.items() if k not in named},
            }
        return super().from_json(doc, where)

    def adding(self, output: str, **figures) -> PartFigures:
        """These figures with `figures` added to those of `output`."""
        return dataclasses.replace(
            self, outputs={**self.outputs, output: dataclasses.replace(self.outputs[output], **figures)}
        )


Parts = dict[str, PartFigures]
"""A part's name -> its figures."""


def measure(
    name: str, module: nn.Module, inputs: dict[str, torch.Tensor], describe: str, ref: nn.Module | None = None
) -> tuple[PartFigures, dict[str, tuple[torch.Tensor, ...]]]:
    """Per output: GPU fp16, torch float16 and GPU fp32, each vs torch float64 on the same inputs.
    -> (figures for the JSON, raw outputs {output: (f64, torch16, gpu16, gpu32)})."""
    with torch.no_grad():
        exact = copy.deepcopy(ref or module).double()(**{k: v.double() for k, v in inputs.items()})
        torch16 = half(module)(**{k: v.half() for k, v in inputs.items()})
    gpu = gpu_runs(module, inputs, name)
    ADAPTER.setdefault("name", gpu.adapter)
    raw = {k: (exact[k], torch16[k], gpu.fp16[k], gpu.fp32[k]) for k in exact}
    outputs = {
        k: OutputFigures(
            gpu_fp16_vs_f64=sig(rel(g16, e)),
            torch_fp16_vs_f64=sig(rel(h, e)),
            gpu_fp32_vs_f64=sig(rel(g32, e)),
            max_abs_f64=sig(float(e.abs().max())),
        )
        for k, (e, h, g16, g32) in raw.items()
    }
    line = "  ".join(
        f"{k}: gpu16 {v.gpu_fp16_vs_f64:.3g} torch16 {v.torch_fp16_vs_f64:.3g} gpu32 {v.gpu_fp32_vs_f64:.3g}"
        for k, v in outputs.items()
    )
    print(f"{name:28s} {line}", flush=True)
    return PartFigures(inputs=describe, outputs=outputs), raw


class Fn(nn.Module):
    """A part as a module: fn(**inputs) -> {name: tensor}, with optional parameters."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v.detach().clone(), requires_grad=False))

    def forward(self, **inputs):
        return self.fn(self, **inputs)


# ---------------------------------------------------------------------------------------------
# real inputs: the first GatedDeltaNet of the tiny checkpoint on a random record


def load_model():
    snap = snapshot.verify(snapshot.load_record())
    model, _, _ = patch.load(snap, FORM, progress=False)
    return model, Host(snap)


@dataclasses.dataclass(frozen=True)
class Captured:
    """The first GatedDeltaNet on a record: the record, the module, its input x and valid, projections
    (qkv, z, beta, a), conv output, q/k/v (heads interleaved), g and the kernel's core."""

    record: dict[str, torch.Tensor]
    gdn: nn.Module
    x: torch.Tensor
    valid: torch.Tensor
    qkv: torch.Tensor
    conv: torch.Tensor
    z: torch.Tensor
    beta: torch.Tensor
    a: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    core: torch.Tensor


def capture(model, host, length: int, seed: int) -> Captured:
    """The first GatedDeltaNet's input, projections, conv output, q/k/v (heads interleaved), g and core."""
    vocab = host.embed_tokens.shape[0]
    record = host.record(record_text.random_ids(length, vocab, seed), length)
    gdn = next(layer.linear_attn for layer in model.layers if layer.block_type == "linear_attention")
    seen = {}

    def keep_input(module, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    hook = gdn.register_forward_pre_hook(keep_input, with_kwargs=True)
    with torch.no_grad():
        ClefRowPrefill(model, length)(**record)
        hook.remove()
        x, valid = seen["x"], record["valid"]
        keep, qkv, z, beta, a = gdn.project(x, valid)
        conv = F.silu(gdn.conv1d(qkv.transpose(1, 2))[:, :, :length]).transpose(1, 2) * keep
        q, k, v = torch.split(conv, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        r = gdn.num_v_heads // gdn.num_k_heads
        q = patch.interleave_heads(q.reshape(1, length, -1, gdn.head_k_dim), r)
        k = patch.interleave_heads(k.reshape(1, length, -1, gdn.head_k_dim), r)
        v = v.reshape(1, length, -1, gdn.head_v_dim)
        g = -gdn.A_log.exp() * gated_delta.safe_softplus(a + gdn.dt_bias)
        core, _ = gdn.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    return Captured(
        record=record, gdn=gdn, x=x, valid=valid, qkv=qkv, conv=conv, z=z, beta=beta, a=a, q=q, k=k, v=v, g=g, core=core
    )


@dataclasses.dataclass(frozen=True)
class KernelPieces:
    """The kernel's intermediate tensors, laid out [chunks, heads, C, ..]: g chunk-major, the pair log-decays,
    N, u, w, the decayed q, the in-chunk attention, the k tail and each chunk's carry."""

    g_chunks: torch.Tensor
    pair: torch.Tensor
    n_mat: torch.Tensor
    u: torch.Tensor
    w: torch.Tensor
    q_decayed: torch.Tensor
    intra: torch.Tensor
    k_tail: torch.Tensor
    carry: torch.Tensor


def kernel_pieces(c: Captured, form: kernel_form.Form) -> KernelPieces:
    """The kernel's intermediate tensors for the captured inputs, computed by the kernel's own pieces
    (gated_delta.in_chunk, decayed, carry) in fp32, laid out [chunks, heads, C, ..] as the part graphs take them."""
    const = gated_delta.chunk_constants(form.chunk)
    length, h, dk = c.k.shape[1:]
    n = length // form.chunk

    def chunk_major(t, tail):
        return t.transpose(1, 2).reshape(h, n, form.chunk, *tail).transpose(0, 1).contiguous()

    with torch.no_grad():
        q = chunk_major(gated_delta.l2norm(c.q), (dk,)) * dk**-0.5
        k = chunk_major(gated_delta.l2norm(c.k), (dk,))
        v = chunk_major(c.v * form.v_scale, (c.v.shape[-1],))
        beta = chunk_major(c.beta, ())
        g = chunk_major(torch.clamp_min(c.g, gated_delta.G_FLOOR), ())
        ic = gated_delta.in_chunk(q, k, v, beta, g, form, const)
        w, q_decayed, k_tail = gated_delta.decayed(ic, form)
        return KernelPieces(
            g_chunks=g,
            pair=ic.pair,
            n_mat=ic.n_mat,
            u=ic.u,
            w=w,
            q_decayed=q_decayed,
            intra=ic.intra,
            k_tail=k_tail,
            carry=gated_delta.carry(ic, form),
        )


# ---------------------------------------------------------------------------------------------
# the parts


def error_where(raw: tuple, mask: torch.Tensor | None = None, relative: bool = False) -> MaxError:
    """Max error of torch float16, GPU fp16 and GPU fp32 against float64, absolute or elementwise relative,
    over `mask` (every element when None)."""
    e = raw[0]
    out = {}
    for label, t in (("torch_fp16", raw[1]), ("gpu_fp16", raw[2]), ("gpu_fp32", raw[3])):
        err = (t.double() - e).abs() / (e.abs() if relative else 1.0)
        out[label] = sig(float(err[mask].max() if mask is not None else err.max()))
    return MaxError(**out)


def softplus_parts(c: Captured) -> Parts:
    """g = -exp(A_log) softplus(a + dt_bias) on the real a, and softplus on a sweep, log1p form vs series."""
    out = {}
    gdn = c.gdn
    sweep = torch.linspace(-12.0, 4.0, 1024).reshape(1, 1024)
    for tag, fn in (("before", log1p_softplus), ("after", series_softplus)):

        def g_of(fn_):
            return Fn(lambda m, a: {"g": -m.A_log.exp() * fn_(a + m.dt_bias)}, A_log=gdn.A_log, dt_bias=gdn.dt_bias)

        figs, raw = measure(
            f"g_softplus_{tag}",
            g_of(fn),
            {"a": c.a},
            f"a [1, {PART_L}, 4] from in_proj_a (layer 0, seed {PART_SEED}); g = -exp(A_log) softplus(a + dt_bias)",
            ref=g_of(F.softplus),
        )
        small = raw["g"][0].abs() < 0.1
        out[f"g_softplus_{tag}"] = figs.adding(
            "g", small_g_count=int(small.sum()), max_abs_err_where_small_g=error_where(raw["g"], small)
        )
        figs, raw = measure(
            f"softplus_sweep_{tag}",
            Fn(lambda m, x, _fn=fn: {"y": _fn(x)}),
            {"x": sweep},
            "x = linspace(-12, 4, 1024); softplus(x)",
            ref=Fn(lambda m, x: {"y": F.softplus(x)}),
        )
        out[f"softplus_sweep_{tag}"] = figs.adding("y", max_elementwise_rel=error_where(raw["y"], relative=True))
    return out


def recurrence(m, u, w, q_decayed, intra, k_tail, carry):
    """The kernel's unrolled inter-chunk state update, on its per-chunk tensors."""
    state, outs = u.new_zeros(u.shape[1], w.shape[-1], u.shape[-1]), []
    for i in range(u.shape[0]):
        v_new = u[i] - w[i] @ state
        outs.append(q_decayed[i] @ state + intra[i] @ v_new)
        state = state * carry[i] + k_tail[i] @ v_new
    return {"out": torch.cat(outs, dim=1), "state": state}


def kernel_parts(c: Captured) -> Parts:
    """The chunk kernel of FORM piece by piece, then whole, then the gated norm after it."""
    form = kernel_form.parse(FORM)
    const = gated_delta.chunk_constants(form.chunk)
    kern = gated_delta.make_kernel(form)
    p = kernel_pieces(c, form)
    pads = c.k.clone()
    pads[:, -8:] = 0.0  # zero rows, as the pad guard leaves them: l2norm(0) must stay 0, not NaN
    parts = [
        (
            "l2norm",
            lambda m, q, k: {"q": gated_delta.l2norm(q), "k": gated_delta.l2norm(k)},
            {"q": c.q, "k": pads},
            f"q, k [1, {PART_L}, 4, 32] post-conv; k's last 8 rows zero (eps 1e-6 is subnormal in fp16)",
        ),
        (
            "decays_dd",
            lambda m, g: dict(
                zip(("pair", "prefix", "total", "tail"), gated_delta.decays(g, form, const), strict=True)
            ),
            {"g": p.g_chunks},
            "g chunk-major [4 chunks, 4 heads, 64], floored at -30: segment-sum matmuls",
        ),
        (
            "pair_decay",
            lambda m, pair: {"gamma": gated_delta.pair_decay(pair, form, const)},
            {"pair": p.pair},
            "pair log-decays [4, 4, 64, 64]: exp(min(pair, 0)) x lower mask",
        ),
        (
            "block_inverse",
            lambda m, n: {"t": gated_delta.block_inverse(n, const)},
            {"n": p.n_mat},
            "N = -(beta k k^T) gamma, strictly lower [4, 4, 64, 64]: (I - N)^-1",
        ),
        (
            "chunk_recurrence",
            recurrence,
            {k: getattr(p, k) for k in ("u", "w", "q_decayed", "intra", "k_tail", "carry")},
            "the kernel's per-chunk tensors (vs6 scale) -> the unrolled inter-chunk state update, 4 chunks",
        ),
        (
            "kernel",
            lambda m, q, k, v, g, beta: {"core": kern(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]},
            {k: getattr(c, k) for k in ("q", "k", "v", "g", "beta")},
            f"q, k, v, g, beta [L={PART_L}] -> core (x 2^6)",
        ),
    ]
    out = {name: measure(name, Fn(fn), inputs, describe)[0] for name, fn, inputs, describe in parts}
    for tag, k in (("vs6", 0), ("vs12", 6)):  # vs12: core 2^6 x larger, eps 4^6 x larger
        gated = copy.deepcopy(c.gdn.norm)
        gated.variance_epsilon *= 4.0**k
        part = Fn(lambda m, core, z: {"y": m.norm(core.reshape(-1, 32), z.reshape(-1, 32))})
        part.norm = gated
        top = float(c.core.abs().max()) * 2**k
        out[f"gated_norm_{tag}"] = measure(
            f"gated_norm_{tag}",
            part,
            {"core": c.core * 2.0**k, "z": c.z},
            f"core x 2^{6 + k} (max |core| {top:.4g}), z; eps x 4^{6 + k}",
        )[0]
    return out


def projection_parts(c: Captured) -> Parts:
    gdn = c.gdn
    out = {}
    for tag, width in (("before", 0), ("after", SK_WIDTH)):
        w = gdn.in_proj_qkv.weight
        fc = Fn(lambda m, x, _w=width: {"qkv": F.linear(x, m.W) if not _w else split_k_linear(x, m.W, None, _w)}, W=w)
        out[f"in_proj_qkv_{tag}"] = measure(
            f"in_proj_qkv_{tag}",
            fc,
            {"x": c.x},
            f"x [1, {PART_L}, 128] (the GatedDeltaNet's input) @ W^T [128 -> 256]"
            + (f", split-K {width}" if width else ""),
        )[0]
        layer = copy.deepcopy(gdn)
        if width:
            with_fix(layer, width)

        def front(m, x, valid):
            keep, qkv, z, beta, a = m.gdn.project(x, valid)
            conv = F.silu(m.gdn.conv1d(qkv.transpose(1, 2))[:, :, : qkv.shape[1]]).transpose(1, 2) * keep
            return {"y": m.gdn.mix(conv, z, beta, a)[0], "conv": conv, "z": z, "beta": beta, "a": a}

        part = Fn(front)
        part.gdn = layer
        describe = f"the first GatedDeltaNet on its real input x [1, {PART_L}, 128]: pad guard, projections, conv, mix"
        if width:
            describe += f"; fix: split-K {width} projections, series softplus"
        figs, raw = measure(f"gdn_layer_{tag}", part, {"x": c.x, "valid": c.valid}, describe)
        out[f"gdn_layer_{tag}"] = dataclasses.replace(figs, mix_on_gpu_fp16_projections=mix_attribution(gdn, raw))
    return out


def mix_attribution(gdn, raw: dict[str, tuple[torch.Tensor, ...]]) -> MixAttribution:
    """The float64 mix fed each source's projections (conv, z, beta, a) vs fed the float64 ones:
    how much of the layer's error the projections carry, and which of them."""
    mix64 = copy.deepcopy(gdn).double()

    def mix(d):
        return mix64.mix(d["conv"].double(), d["z"].double(), d["beta"].double(), d["a"].double())[0]

    exact = {k: raw[k][0] for k in ("conv", "z", "beta", "a")}
    y0 = mix(exact)

    def shares(i: int) -> MixShares:
        src = {k: raw[k][i] for k in exact}
        return MixShares(all=sig(rel(mix(src), y0)), **{k: sig(rel(mix({**exact, k: src[k]}), y0)) for k in exact})

    return MixAttribution(gpu_fp16=shares(2), torch_fp16=shares(1))


# ---------------------------------------------------------------------------------------------
# one-op graphs


def fp16_sequential_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The GPU's fp16 FULLY_CONNECTED as measured: products rounded to fp16, one accumulator, K in order."""
    h = lambda t: t.half().float()  # noqa: E731
    xf = h(x.float()).reshape(-1, x.shape[-1])
    wf = h(w.float())
    acc = torch.zeros(xf.shape[0], wf.shape[0])
    for j in range(xf.shape[-1]):
        acc = h(acc + h(xf[:, j : j + 1] * wf[None, :, j]))
    return acc.reshape(*x.shape[:-1], -1)


def linear_part(width: int, w: torch.Tensor) -> Fn:
    """x @ W^T as one FULLY_CONNECTED (width 0) or split-K in slices of `width`."""
    return Fn(lambda m, x: {"y": split_k_linear(x, m.W, None, width) if width else F.linear(x, m.W)}, W=w)


def first_value(raw: tuple) -> FirstValues:
    return FirstValues(
        **{
            label: sig(float(t.flatten()[0]))
            for label, t in zip(("f64", "torch_fp16", "gpu_fp16"), raw[:3], strict=True)
        }
    )


def one_ops(c: Captured) -> Parts:
    """One-op graphs: LOG(1 + x), FULLY_CONNECTED at K = 32..2048 (and split-K), SUM / MEAN accumulation,
    and the overflow of a square."""
    out = {}
    x = torch.logspace(-6, 0, 256).reshape(1, 256)
    figs, raw = measure(
        "op_log1p",
        Fn(lambda m, x: {"y": torch.log1p(x)}),
        {"x": x},
        "x = logspace(-6, 0, 256); litert lowers log1p to ADD(x, 1) + LOG",
    )
    zero = raw["y"][2][0] == 0
    out["op_log1p"] = figs.adding(
        "y",
        gpu_fp16_zero_up_to_x=sig(float(x[0][zero].max())) if bool(zero.any()) else 0.0,
        max_elementwise_rel=error_where(raw["y"], relative=True),
    )
    w = c.gdn.in_proj_qkv.weight
    gen = torch.Generator().manual_seed(0)
    cases = [("op_fully_connected_real_K128", c.x, w, "the real x and in_proj_qkv weight")]
    for k in (32, 128, 512, 2048):
        xs, ws = torch.randn(1, 64, k, generator=gen), torch.randn(128, k, generator=gen) / k**0.5
        cases.append((f"op_fully_connected_K{k}", xs, ws, f"x ~ N(0, 1) [1, 64, {k}], W ~ N(0, 1/K) [128, {k}]"))
    for name, xs, ws, describe in cases:
        figs, raw = measure(name, linear_part(0, ws), {"x": xs}, describe + "; one FULLY_CONNECTED")
        same = raw["y"][2].double() == fp16_sequential_linear(xs, ws).double()
        out[name] = figs.adding(
            "y", gpu_fp16_bitwise_equal_to_fp16_sequential_accumulation=sig(float(same.double().mean()))
        )
    for width in (32, 16, 8):
        name = f"op_split_k_{width}_real_K128"
        describe = f"the real x and in_proj_qkv weight; BATCH_MATMUL over {128 // width} slices of {width} + SUM"
        out[name] = measure(name, linear_part(width, w), {"x": c.x}, describe)[0]
    mul_sum = Fn(lambda m, x: {"y": (x.reshape(-1, 1, 128) * m.W.reshape(1, -1, 128)).sum(-1)}, W=w)
    out["op_mul_sum_real_K128"] = measure(
        "op_mul_sum_real_K128",
        mul_sum,
        {"x": c.x},
        "the same dot products as MUL + SUM over K (needs M x N x K memory)",
    )[0]
    reductions = [
        (
            "op_sum_2048_of_0.1",
            lambda m, x: {"y": x.sum(-1)},
            torch.full((1, 4, 2048), 0.1),
            "SUM of 2048 x 0.1 (= 204.8; one sequential fp16 accumulator gives 236.1)",
        ),
        (
            "op_mean_128_of_1000",
            lambda m, x: {"y": x.mean(-1)},
            torch.full((1, 4, 128), 1000.0),
            "MEAN of 128 x 1000 (the sum, 128000, is past fp16's 65504)",
        ),
        (
            "op_square_overflow",
            lambda m, x: {"y": torch.rsqrt((x * x).mean(-1) + 1e-6)},
            torch.full((1, 4, 32), 300.0),
            "rsqrt(mean(x * x)) at x = 300: x * x = 90000 overflows fp16 (what vs12 does to the gated norm)",
        ),
    ]
    for name, fn, xs, describe in reductions:
        figs, raw = measure(name, Fn(fn), {"x": xs}, describe)
        out[name] = figs.adding("y", values=first_value(raw["y"]))
    return out


# ---------------------------------------------------------------------------------------------
# before / after on whole graphs: one layer, the L=64 row graph


def truncated(model, layers: int):
    m = copy.deepcopy(model)
    m.layers = m.layers[:layers]
    m.config = copy.deepcopy(m.config)
    m.config.num_hidden_layers = layers
    m.config.layer_types = m.config.layer_types[:layers]
    return m


@dataclasses.dataclass(frozen=True)
class GraphFigures(Record):
    """A whole graph before or after the fix: GPU fp16 against stock float64 per seed, its median, the mean
    per position, GPU fp32's and torch fp32's (against the current form in float64) worst, the conversion's
    seconds, and the worst seed's ratio to the torch-float16 floor."""

    gpu_fp16_vs_f64: list[float]
    gpu_fp16_median: float
    gpu_fp16_mean_per_position: float
    gpu_fp32_vs_f64_max: float
    torch_fp32_vs_current_form_f64_max: float
    convert_seconds: float
    over_floor_max: float


@dataclasses.dataclass(frozen=True)
class GraphScope(Record):
    """One scope (one layer, the row graph) on MODEL_SEEDS' records: the floor per seed and per position,
    and the graph before and after the fix."""

    L: int
    seeds: list[int]
    floor_stock_torch_fp16_vs_f64: list[float]
    floor_mean_per_position: float
    before: GraphFigures
    after: GraphFigures


@dataclasses.dataclass(frozen=True)
class WholeGraphs(Record):
    """The fix before and after on one layer, then on the whole row graph (graph_rows)."""

    one_layer: GraphScope
    row: GraphScope


def graph_rows(model, host) -> WholeGraphs:
    vocab = host.embed_tokens.shape[0]
    records = {s: host.record(record_text.random_ids(MODEL_L, vocab, s), MODEL_L) for s in MODEL_SEEDS}
    out = {}
    for scope, layers in (("one_layer", 1), ("row", 0)):
        base = truncated(model, layers) if layers else model
        twin = patch.stock_twin(base)
        exact, floor16 = model_check.in_float64(twin), copy.deepcopy(twin).to(torch.float16)
        current64 = ClefRowPrefill(copy.deepcopy(base).double(), MODEL_L)
        refs, floors, cur = {}, {}, {}
        with torch.no_grad():
            for s, r in records.items():
                refs[s] = exact(inputs_embeds=r["embeds"].double(), use_cache=False).last_hidden_state
                floors[s] = floor16(inputs_embeds=r["embeds"].half(), use_cache=False).last_hidden_state
                cur[s] = current64(**{k: v.double() for k, v in r.items()})["hidden"]
        floor = [sig(rel(floors[s], refs[s])) for s in MODEL_SEEDS]
        figures = {}
        for tag in ("before", "after"):
            m = base if tag == "before" else with_fix(copy.deepcopy(base))
            e = figures[tag] = graph_figures(m, records, refs, cur, floor, f"{scope}_{tag}_L{MODEL_L}")
            print(
                f"{scope} {tag}: gpu16 median {e.gpu_fp16_median:.4g} max {max(e.gpu_fp16_vs_f64):.4g} "
                f"mean/pos {e.gpu_fp16_mean_per_position:.4g}; gpu32 {e.gpu_fp32_vs_f64_max:.3g}; "
                f"torch fp32 vs current form f64 {e.torch_fp32_vs_current_form_f64_max:.3g}",
                flush=True,
            )
        out[scope] = GraphScope(
            L=MODEL_L,
            seeds=list(MODEL_SEEDS),
            floor_stock_torch_fp16_vs_f64=floor,
            floor_mean_per_position=sig(mean_per_position(floors, refs)),
            **figures,
        )
    return WholeGraphs(**out)


def mean_per_position(outs: dict[int, torch.Tensor], refs: dict[int, torch.Tensor]) -> float:
    return sum(sum(compare.rel_per_position(outs[s], refs[s])) / MODEL_L for s in refs) / len(refs)


def graph_figures(model, records, refs, current64, floor: list[float], name: str) -> GraphFigures:
    """`model`'s row graph converted and run on the GPU accelerator on `records`, against `refs` (stock
    float64), torch fp32 against `current64` (the current form in float64), fp16 against `floor`."""
    row = ClefRowPrefill(model, MODEL_L)
    with torch.no_grad():
        t32 = {s: row(**r)["hidden"] for s, r in records.items()}
    SCRATCH.mkdir(parents=True, exist_ok=True)
    path = SCRATCH / f"{name}.tflite"
    start = time.time()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        export.convert(row, records[0], path)
    seconds = time.time() - start
    gpu = {}
    for mode, fp32 in (("fp16", False), ("fp32", True)):
        compiled = gpu_accelerator.compile(path, "fp32" if fp32 else "fp16")
        gpu[mode] = {s: compiled.signature()(**records[s])["hidden"] for s in records}
    rels = [sig(rel(gpu["fp16"][s], refs[s])) for s in records]
    return GraphFigures(
        gpu_fp16_vs_f64=rels,
        gpu_fp16_median=sorted(rels)[len(rels) // 2],
        gpu_fp16_mean_per_position=sig(mean_per_position(gpu["fp16"], refs)),
        gpu_fp32_vs_f64_max=sig(max(rel(gpu["fp32"][s], refs[s]) for s in records)),
        torch_fp32_vs_current_form_f64_max=sig(max(rel(t32[s], current64[s]) for s in records)),
        convert_seconds=round(seconds, 1),
        over_floor_max=sig(max(a / b for a, b in zip(rels, floor, strict=True))),
    )


@dataclasses.dataclass(frozen=True)
class SoftplusExactness(Record):
    """The series softplus against the log1p form in float64, and each in fp32 against float64 truth."""

    series_vs_log1p_form_f64_max_rel: float
    log1p_form_fp32_vs_truth_max_rel: float
    series_fp32_vs_truth_max_rel: float


@dataclasses.dataclass(frozen=True)
class SplitKExactness(Record):
    """Split-K against one matmul in float64, and each in fp32 against float64 (in_proj_qkv, real inputs)."""

    split_k_vs_linear_f64: float
    linear_fp32_vs_f64: float
    split_k_fp32_vs_f64: float


@dataclasses.dataclass(frozen=True)
class FixExactness(Record):
    """The fix's formulas against the current ones: the softplus on a sweep, the projection on real inputs."""

    softplus: SoftplusExactness = keyed("softplus_on_linspace_-80_80")
    in_proj_qkv: SplitKExactness = keyed("in_proj_qkv_real_inputs")


def exactness(c: Captured) -> FixExactness:
    """The fix's formulas against the current ones: in float64 (formula against formula) and in fp32 (against
    float64 truth). Whole graphs cannot show float64 differences below ~1e-7: the stack's RMSNorms compute in
    float32 even in a float64 copy (transformers' Qwen3_5RMSNorm calls x.float())."""
    x = torch.linspace(-80.0, 80.0, 200001)
    truth = torch.log1p(torch.exp(x.double()))
    diff = (series_softplus(x.double()) - log1p_softplus(x.double())).abs() / truth

    def fp32_vs_truth(fn) -> float:
        return sig(float(((fn(x).double() - truth).abs() / truth).max()))

    soft = SoftplusExactness(
        series_vs_log1p_form_f64_max_rel=sig(float(diff.max())),
        log1p_form_fp32_vs_truth_max_rel=fp32_vs_truth(log1p_softplus),
        series_fp32_vs_truth_max_rel=fp32_vs_truth(series_softplus),
    )
    xs, w = c.x, c.gdn.in_proj_qkv.weight
    exact = F.linear(xs.double(), w.double())
    lin = SplitKExactness(
        split_k_vs_linear_f64=sig(rel(split_k_linear(xs.double(), w.double(), None, SK_WIDTH), exact)),
        linear_fp32_vs_f64=sig(rel(F.linear(xs, w), exact)),
        split_k_fp32_vs_f64=sig(rel(split_k_linear(xs, w, None, SK_WIDTH), exact)),
    )
    return FixExactness(softplus=soft, in_proj_qkv=lin)


def rms_norm_parts(model, c: Captured) -> Parts:
    """An observation, not part of the fix: Qwen3_5RMSNorm's (1 + w) is folded into one constant, which the GPU
    stores in fp16 (a per-channel rounding torch float16 does not make); y + y w keeps w exact."""
    norm = model.layers[0].input_layernorm
    record = c.record["embeds"]
    out = {}

    def y_plus_y_w(m, x):
        y = m.norm._norm(x)
        return {"y": y + y * m.norm.weight}

    for tag, fn in (("stock_(1+w)", lambda m, x: {"y": m.norm(x)}), ("y_plus_y_w", y_plus_y_w)):
        part = Fn(fn)
        part.norm = copy.deepcopy(norm)
        out[f"rms_norm_layer0_{tag}"] = measure(
            f"rms_norm_{tag}",
            part,
            {"x": record},
            f"the record's embeddings [1, {PART_L}, 128], layer 0's input RMSNorm",
        )[0]
    return out


def main() -> None:
    global SCRATCH
    with tempfile.TemporaryDirectory(prefix="gpu_parts.") as tmp:
        SCRATCH = Path(tmp)
        run()


@dataclasses.dataclass(frozen=True)
class Fix(Record):
    """The fix prototyped: projections summed in slices of split_k_width products, and the softplus's log1p."""

    split_k_width: int
    softplus: str


@dataclasses.dataclass(frozen=True)
class GpuParts(Record):
    """results/gpu_parts.json: the parts, the fix's exactness, the one-op graphs and the whole graphs before
    and after the fix, on the adapter named."""

    what: str
    metric: str
    form: str
    fix: Fix
    parts: Parts
    fix_exactness: FixExactness
    one_op: Parts
    graphs: WholeGraphs
    adapter: str | None
    seconds: float


def run() -> None:
    start = time.time()
    torch.manual_seed(0)
    model, host = load_model()
    c = capture(model, host, PART_L, PART_SEED)
    parts = {**softplus_parts(c), **kernel_parts(c), **projection_parts(c), **rms_norm_parts(model, c)}
    fix_exactness, one_op, graphs = exactness(c), one_ops(c), graph_rows(model, host)
    report = GpuParts(
        what="LiteRT GPU accelerator (fp16 and fp32 mode) vs torch float64 and torch float16, part by part, on the "
        "first GatedDeltaNet's real inputs; one-op repros; before/after of the proposed fix (split-K 8 "
        "projections in GatedDeltaNets and MLPs, log1p by series) on one layer and the L=64 row graph",
        metric="max |x - ref| / max |ref| (ref: torch float64 of the same part on the same inputs, or stock float64 "
        "for whole graphs); mean_per_position: mean over positions of ||x - ref|| / ||ref||",
        form=FORM,
        fix=Fix(split_k_width=SK_WIDTH, softplus="log1p by its atanh series to s^21"),
        parts=parts,
        fix_exactness=fix_exactness,
        one_op=one_op,
        graphs=graphs,
        adapter=ADAPTER.get("name"),
        seconds=round(time.time() - start, 1),
    )
    atomic.write_json(OUT, report.to_json())
    print(f"wrote {OUT} in {report.seconds:.0f}s")


if __name__ == "__main__":
    main()
