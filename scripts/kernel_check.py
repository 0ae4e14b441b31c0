"""Kernel-level verification: every form's chunk kernel against float64 truth and the stock kernel.

Four input regimes, each a way the chunked delta rule can go wrong:
  R1 random keys, strong decay (g in [-3, -0.05]): decays underflow inside a chunk;
  R2 random keys, weak decay (g in [-0.02, 0]): the state carries across many chunks;
  R3 correlated keys (one shared direction + 0.3 noise), weak decay: an ill-conditioned inverse;
  R4 one key for every token, no decay: the in-chunk inverse at its worst (every pair interacts).
q and k are drawn with the checkpoint's key-head count and interleaved to the value-head count, so
head pairs are identical as in clef-flash. The truth is the token-by-token recurrence in float64.
Relative error = max |diff| / max |truth|.
"""
from __future__ import annotations

import statistics
import time

import torch

from scripts import clef_kernel

REGIMES = ("R1", "R2", "R3", "R4")
LENGTHS = (256, 130, 200)  # 130 and 200 leave a tail that is not a multiple of any chunk
INIT_STATE_STD = 0.1


def regime_inputs(name: str, length: int, seed: int, hk: int, hv: int, dk: int, dv: int, initial_state: bool):
    """(q, k, v, g, beta, s0) for one regime; q/k drawn with hk heads and interleaved to hv."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, length, hk, dk, generator=gen)
    if name in ("R1", "R2"):
        k = torch.randn(1, length, hk, dk, generator=gen)
    elif name == "R3":
        u = torch.randn(1, 1, hk, dk, generator=gen)
        k = u / u.norm(dim=-1, keepdim=True) * dk ** 0.5 + 0.3 * torch.randn(1, length, hk, dk, generator=gen)
    elif name == "R4":
        k = torch.randn(1, 1, hk, dk, generator=gen).expand(1, length, hk, dk).contiguous()
    else:
        raise ValueError(name)
    v = torch.randn(1, length, hv, dv, generator=gen)
    if name == "R1":
        beta = 0.2 + 0.7 * torch.rand(1, length, hv, generator=gen)
        g = -(0.05 + 2.95 * torch.rand(1, length, hv, generator=gen))
    elif name in ("R2", "R3"):
        beta = 0.2 + 0.7 * torch.rand(1, length, hv, generator=gen)
        g = -0.02 * torch.rand(1, length, hv, generator=gen)
    else:
        beta = torch.full((1, length, hv), 0.5)
        g = torch.zeros(1, length, hv)
    s0 = INIT_STATE_STD * torch.randn(1, hv, dk, dv, generator=gen) if initial_state else None
    r = hv // hk
    q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    return q, k, v, g, beta, s0


def recurrence_f64(q, k, v, g, beta, s0):
    """The gated delta rule token by token in float64: S <- S e^g; S <- S + k (beta (v - S^T k))^T; o = S^T q."""
    q, k, v, g, beta = (x.to(torch.float64) for x in (q, k, v, g, beta))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + clef_kernel.L2NORM_EPS) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + clef_kernel.L2NORM_EPS)
    b, length, h, dk = k.shape
    s = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64) if s0 is None else s0.to(torch.float64).clone()
    outs = []
    for t in range(length):
        s = s * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - (s * k[:, t, :, :, None]).sum(-2)) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outs, 1), s


def rel(x: torch.Tensor, truth: torch.Tensor) -> float:
    return float((x.to(torch.float64) - truth).abs().max() / truth.abs().max().clamp_min(1e-300))


def run_form(form, inputs, dtype=torch.float32, scaled_state=True):
    """A form's kernel on `inputs` in `dtype`; -> (out, state) divided back by 2^vs, in float64.

    Under vs<k> the state passed in is scaled by 2^k (the contract) unless scaled_state is False
    (the control: the wrong contract)."""
    q, k, v, g, beta, s0 = inputs
    scale = form.v_scale
    if s0 is not None and scaled_state:
        s0 = s0 * scale
    cast = [None if x is None else x.to(dtype) for x in (q, k, v, g, beta, s0)]
    out, state = clef_kernel.make_kernel(form)(*cast[:5], initial_state=cast[5], output_final_state=True,
                                               use_qk_l2norm_in_kernel=True)
    return out.to(torch.float64) / scale, state.to(torch.float64) / scale


def finite(*xs) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in xs)


def check(heads: dict, forms: list, seed: int = 0) -> list[dict]:
    """One row per (regime, L, initial state): stock and every form, fp32 and fp16."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as stock_kernel

    rows = []
    case = 0
    for name in REGIMES:
        for length in LENGTHS:
            for init in (False, True):
                case += 1
                inputs = regime_inputs(name, length, seed + case, heads["k"], heads["v"], heads["k_dim"],
                                       heads["v_dim"], init)
                out_t, state_t = recurrence_f64(*inputs)
                q, k, v, g, beta, s0 = inputs
                out_s, state_s = stock_kernel(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
                row = {"regime": name, "L": length, "initial_state": init,
                       "head_pairs_identical": bool(torch.equal(q[:, :, 0::2], q[:, :, 1::2])),
                       "stock": {"out_rel_vs_f64": rel(out_s, out_t), "state_rel_vs_f64": rel(state_s, state_t),
                                 "finite": finite(out_s, state_s)},
                       "forms": {}}
                for text in forms:
                    form = clef_kernel.parse(text)
                    out, state = run_form(form, inputs)
                    out16, state16 = run_form(form, inputs, dtype=torch.float16)
                    entry = {"out_rel_vs_f64": rel(out, out_t), "state_rel_vs_f64": rel(state, state_t),
                             "out_rel_vs_stock": rel(out, out_s.double()),
                             "state_rel_vs_stock": rel(state, state_s.double()),
                             "finite": finite(out, state),
                             "fp16": {"finite": finite(out16, state16),
                                      "out_rel_vs_f64": rel(out16, out_t) if finite(out16) else None,
                                      "state_rel_vs_f64": rel(state16, state_t) if finite(state16) else None}}
                    if init and form.vs:
                        wrong, _ = run_form(form, inputs, scaled_state=False)
                        entry["control_unscaled_state_out_rel_vs_f64"] = rel(wrong, out_t)
                    row["forms"][str(form)] = entry
                rows.append(row)
    return rows


def summarize(rows: list[dict], form: str, threshold: float) -> dict:
    forms = list(rows[0]["forms"])

    def worst(key, f, sub=None):
        vals = [(r["forms"][f][sub] if sub else r["forms"][f])[key] for r in rows]
        return None if any(v is None for v in vals) else max(vals)

    failures = []
    for r in rows:
        e = r["forms"][form]
        where = f"{form} {r['regime']} L={r['L']} initial_state={r['initial_state']}"
        if not e["finite"]:
            failures.append(f"{where}: not finite")
        for key in ("out_rel_vs_f64", "state_rel_vs_f64"):
            if e["finite"] and e[key] > threshold:
                failures.append(f"{where}: {key} {e[key]:.3g} > {threshold:g}")
    controls = [r["forms"][f].get("control_unscaled_state_out_rel_vs_f64") for r in rows for f in forms]
    controls = [c for c in controls if c is not None]
    return {
        "form": form,
        "threshold_rel_vs_f64": threshold,
        "passed": not failures,
        "failures": failures,
        "max_rel_vs_f64": {f: {"out": worst("out_rel_vs_f64", f), "state": worst("state_rel_vs_f64", f)} for f in forms},
        "max_rel_vs_stock": {f: {"out": worst("out_rel_vs_stock", f), "state": worst("state_rel_vs_stock", f)}
                             for f in forms},
        "stock_max_rel_vs_f64": {"out": max(r["stock"]["out_rel_vs_f64"] for r in rows),
                                 "state": max(r["stock"]["state_rel_vs_f64"] for r in rows)},
        "all_finite": all(r["stock"]["finite"] for r in rows) and all(r["forms"][f]["finite"] for r in rows for f in forms),
        "head_pairs_identical": all(r["head_pairs_identical"] for r in rows),
        "fp16": {f: {"all_finite": all(r["forms"][f]["fp16"]["finite"] for r in rows),
                     "max_out_rel_vs_f64": worst("out_rel_vs_f64", f, "fp16"),
                     "max_state_rel_vs_f64": worst("state_rel_vs_f64", f, "fp16")} for f in forms},
        "fp16_note": "fp16 runs the kernel's own arithmetic in float16; `loop` is the stock algorithm op for op "
                     "(transformers' stock function upcasts to float32 inside, so it cannot show fp16)",
        "vs_control_unscaled_state_min_out_rel_vs_f64": min(controls) if controls else None,
    }


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
            for fn, bucket in zip(fns, times):
                t0 = time.perf_counter()
                fn(*args, **kwargs)
                bucket.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def bench(form: str, heads: int, head_dim: int, lengths, repeats: int) -> dict:
    """The form's kernel vs transformers' stock kernel: median time ratio and export node counts."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as stock_kernel

    kernel = clef_kernel.make_kernel(clef_kernel.parse(form))
    rows = []
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        args = (torch.randn(1, length, heads, head_dim, generator=gen), torch.randn(1, length, heads, head_dim, generator=gen),
                torch.randn(1, length, heads, head_dim, generator=gen), -torch.rand(1, length, heads, generator=gen),
                torch.rand(1, length, heads, generator=gen))
        t_stock, t_form = median_seconds([stock_kernel, kernel], args, repeats)
        rows.append({"L": length, "stock_median_s": t_stock, "form_median_s": t_form,
                     "speedup_stock_over_form": t_stock / t_form,
                     "export_nodes_stock": export_nodes(stock_kernel, args),
                     "export_nodes_form": export_nodes(kernel, args)})
    return {"form": form, "heads": heads, "head_dim": head_dim, "repeats": repeats, "torch_threads": torch.get_num_threads(),
            "rows": rows}
