"""Layer- and model-level verification of the patched stack against stock transformers.

The reference is transformers' own stock classes with the same weights, run twice:
- in fp32 as shipped (recorded), and
- in float64, the exact stock function (the threshold applies here). The stock chunk kernel casts
  to float32 inside, so its float64 run swaps in the `loop` form, which is the stock algorithm op
  for op (a test shows it equal to the stock kernel bit for bit in fp32).
Why both: the stock fp32 run has rounding of its own (its decays are differences of long cumulative
sums, which cancel; `dd` is the cure), so a fp32-vs-fp32 figure partly measures the stock kernel.
The figures show all three.

verify_layers: every GatedDeltaNet, patched and under the form, against the stock class on random
hidden states with a right pad (real positions). verify_model: the row graph against the stock twin
for a full, a padded and a 1-token record at each L; and causality: garbage vs zero after the last
real token leaves the real positions unchanged (at the same L; across L the float64 form shows the
pad logic exact). Causality is not the pad guard: real positions never see later pads whatever the
guard does; verify_pair's chaining with padded prefixes is what sees the guard.
Both rerun with the memory-cut fault (scripts/checks/controls.py), which must break the bound.
Errors: scripts/checks/compare.py, global and per position, over the real positions.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scripts.checks import compare, controls, layerwise, records
from scripts.layers import gated_delta
from scripts.pipeline import profile
from scripts.pipeline.records import Record
from scripts.qwen35 import model_change, patch
from scripts.qwen35.host import Host
from scripts.qwen35.row_graph import ClefRowPrefill

if TYPE_CHECKING:
    from scripts.checks.record_text import RecordTokens

EXACT = "loop"  # the stock algorithm; in float64 it is the exact reference


def in_float64(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of a module (one GatedDeltaNet; a whole stack only in benchmarks) running the
    exact stock algorithm."""
    exact = copy.deepcopy(module).to(torch.float64)
    gated_delta.set_form(exact, EXACT)
    return exact


@contextlib.contextmanager
def exact_by_layer(stack: torch.nn.Module):
    """`stack` (stock, its weights fp32) as the exact reference inside the block: the stock algorithm
    in float64, one layer's float64 weights at a time (scripts/checks/layerwise.py), never a copy."""
    with gated_delta.form_applied(stack, EXACT), layerwise.cast_by_layer(stack, stack.layers, torch.float64):
        yield stack


def layer_rows(model, form: str, length: int = 200, n_real: int = 173, scales=(1.0, 3.0), seeds=(5, 6)) -> list[dict]:
    """`model`: a loaded stock text stack. Patches it in place (and applies `form`) on the way."""
    layers = [(i, layer.linear_attn) for i, layer in enumerate(model.layers) if layer.block_type == "linear_attention"]
    valid = torch.zeros(1, length)
    valid[0, :n_real] = 1.0
    cases = [
        (
            seed,
            scale,
            torch.randn(1, length, model.config.hidden_size, generator=torch.Generator().manual_seed(seed)) * scale,
        )
        for seed in seeds
        for scale in scales
    ]
    with torch.no_grad():
        refs = {}
        for i, m in layers:
            exact = in_float64(m)
            for seed, scale, x in cases:
                refs[(i, seed, scale)] = (m(x)[0, :n_real], exact(x.double())[0, :n_real])
        patch.patch(model)
        gated_delta.set_form(model, form)
        rows = []
        for i, m in layers:
            for seed, scale, x in cases:
                with model_change.changed(m, count_interleave=True) as done:
                    out = m(x, attention_mask=valid)[0, :n_real]
                stock, exact = refs[(i, seed, scale)]
                row = {"layer": i, "seed": seed, "input_scale": scale, "L": length, "n_real": n_real}
                if controls.memory_cut_applies(form, n_real):
                    with model_change.changed(m, memory_cut=True):
                        row["control_memory_cut_rel_vs_stock_f64"] = compare.rel(
                            m(x, attention_mask=valid)[0, :n_real], exact
                        )
                rows.append(
                    {
                        **row,
                        **compare.figures("vs_stock_f64", out, exact),
                        **compare.figures("vs_stock_fp32", out, stock),
                        **compare.figures("stock_fp32_vs_f64", stock, exact),
                        "finite": bool(torch.isfinite(out).all()),
                        "interleave_calls": done.interleave_calls["calls"],
                        "interleave_calls_expected": 2,
                    }
                )
    return rows


def model_rows(model, host: Host, lengths, text: RecordTokens, seed: int = 0) -> list[dict]:
    """Row graph vs the stock twin, and causality, at every L, on records of `text`. `model`: patched,
    form applied."""
    form = gated_delta.gated_deltanets(model)[0].chunk_gated_delta_rule.form
    twin = patch.stock_twin(model)
    gdn_layers = len(gated_delta.gated_deltanets(model))
    rows = []
    for length in lengths:
        graph = ClefRowPrefill(model, length).eval()
        for kind, n in records.row_tokens(length).items():
            inputs = host.record(text.ids(n, seed + length + n), length)
            host.check(inputs, length)
            real = inputs["embeds"][:, :n]
            with torch.no_grad(), profile.part("torch"), model_change.changed(graph, count_interleave=True) as done:
                hidden = graph(**inputs)["hidden"][0, :n]
            with torch.no_grad():
                with profile.part("torch"):
                    stock = twin(inputs_embeds=real, use_cache=False).last_hidden_state[0]
                with exact_by_layer(twin):
                    exact = twin(inputs_embeds=real.double(), use_cache=False).last_hidden_state[0]
            control = {}
            if controls.memory_cut_applies(form, n):
                with torch.no_grad(), profile.part("torch"), model_change.changed(model, memory_cut=True):
                    control["control_memory_cut_rel_vs_stock_f64"] = compare.rel(
                        graph(**inputs)["hidden"][0, :n], exact
                    )
            rows.append(
                {
                    "check": "vs_stock",
                    "L": length,
                    "record": kind,
                    "n_real": n,
                    **compare.figures("vs_stock_f64", hidden, exact),
                    **compare.figures("vs_stock_fp32", hidden, stock),
                    **compare.figures("stock_fp32_vs_f64", stock, exact),
                    **control,
                    "finite": bool(torch.isfinite(hidden).all()),
                    "interleave_calls": done.interleave_calls["calls"],
                    "interleave_calls_expected": 2 * gdn_layers,
                }
            )
        rows.append(causality(model, host, length, text, seed).to_json())  # judged with the others, as a mapping
    return rows


@dataclass(frozen=True)
class CausalityRow(Record):
    """verify_model's causality row at one L (results/model.json `rows`): n real tokens with zero pads,
    garbage pads and none, their differences, and whether the garbage-padded output is finite."""

    check: str
    L: int
    n_real: int
    rel_causality: float
    rel_garbage_vs_zero_pads: float
    rel_f64_no_pads_vs_zero_pads: float
    fp32_rel_no_pads_vs_zero_pads: float
    finite: bool


def causality(model, host: Host, length: int, text: RecordTokens, seed: int) -> CausalityRow:
    """One record of n tokens: zero pads to L, garbage pads to L, and no pads (a graph of L = n).

    Garbage vs zero pads at the same L must agree exactly in fp32 (same shapes, same arithmetic: an
    exact match needs no float64 run). Across pad amounts the fp32 shapes differ, so rounding differs
    (recorded); the float64 runs with and without the pads show the arithmetic after the last token
    changes nothing before it. In a causal model this holds with or without the pad guard: it shows
    causality, and cannot see the guard."""
    n = records.causality_tokens(length)
    ids = text.ids(n, seed + 7 * length)
    zero = host.record(ids, length)
    garbage = {k: v.clone() for k, v in zero.items()}
    gen = torch.Generator().manual_seed(seed + length)
    for key in ("embeds", "cos", "sin"):
        garbage[key][:, n:] = 5.0 * torch.randn(garbage[key][:, n:].shape, generator=gen)
    bare = host.record(ids, n)

    def run(inputs, size, dtype):
        """The form itself, in fp32 or in float64 (its pad logic without rounding, one layer at a time)."""
        graph = ClefRowPrefill(model, size).eval()
        with torch.no_grad(), layerwise.cast_by_layer(graph, model.layers, dtype):
            return graph(**{k: v.to(dtype) for k, v in inputs.items()})["hidden"][0, :n]

    h_zero, h_garbage, h_bare = (
        run(zero, length, torch.float32),
        run(garbage, length, torch.float32),
        run(bare, n, torch.float32),
    )
    e_zero, e_bare = run(zero, length, torch.float64), run(bare, n, torch.float64)
    return CausalityRow(
        check="causality",
        L=length,
        n_real=n,
        rel_causality=compare.largest([compare.rel(h_garbage, h_zero), compare.rel(e_bare, e_zero)]),
        rel_garbage_vs_zero_pads=compare.rel(h_garbage, h_zero),
        rel_f64_no_pads_vs_zero_pads=compare.rel(e_bare, e_zero),
        fp32_rel_no_pads_vs_zero_pads=compare.rel(h_bare, h_zero),
        finite=bool(torch.isfinite(h_garbage).all()),
    )


def failures(rows: list[dict], limits: dict) -> list[str]:
    """limits: {row key: bound} (scripts/checks/compare.py judges them, NaN failing). -> one line per row over
    a bound, not finite, or with a miscounted head interleave."""
    out = compare.judge(rows, limits)
    for r in rows:
        if "interleave_calls_expected" in r and r["interleave_calls"] != r["interleave_calls_expected"]:
            out.append(
                f"{compare.where(r)}{r['interleave_calls']} interleave calls, expected {r['interleave_calls_expected']}"
            )
    return out
