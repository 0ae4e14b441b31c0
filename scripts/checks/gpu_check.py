"""Verification on LiteRT's GPU accelerator: every signature of a graph compiled for the GPU alone,
in fp32 (`enforce_f32`) and in the accelerator's default fp16 mode, on host-built records.

- fp32: every output of every signature against the torch graph on the same inputs; a pair's suffix
  is fed the torch prefix's state, so each signature is judged on its own. Bound: verify_gpu.max_rel_fp32.
- fp16: every output finite (a failure otherwise), and the hidden states against stock transformers
  in float64, beside the half-precision floor: stock transformers run in torch float16 on the same
  tokens against the same float64. The target is fp16 <= verify_gpu.fp16_max_over_floor x floor.
- pairs also chain on the GPU: suffix(prefix(x[:p]), x[p:p+s]) for p in {1, P/2, P}, s in {1, S},
  in both modes, against the row graph in torch (fp32) and stock float64 (fp16).
Errors: scripts/checks/compare.py, global and per position; fp32 holds both to their bounds
(verify_gpu.max_rel_fp32, max_rel_per_position_fp32).
"""

from __future__ import annotations

import torch

from scripts.checks import compare, layerwise, model_check
from scripts.litert import gpu_accelerator
from scripts.pipeline import params
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host, PairRunner
from scripts.qwen35.row_graph import ClefRowPrefill

MODES = {"fp32": True, "fp16": False}  # mode -> enforce_f32


class StockReferences:
    """Stock transformers (the same weights) in float64, the truth, and in torch float16, the floor."""

    def __init__(self, model):
        self.twin = patch.stock_twin(model)

    def hidden(self, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[1, n, H] real-token embeddings -> (float64 hidden [n, H], float16 hidden [n, H]), each one
        converted layer at a time (scripts/checks/layerwise.py)."""
        twin = self.twin
        with torch.no_grad():
            with model_check.exact_by_layer(twin):
                exact = twin(inputs_embeds=embeds.double(), use_cache=False).last_hidden_state[0]
            with layerwise.cast_by_layer(twin, twin.layers, torch.float16):
                half = twin(inputs_embeds=embeds.half(), use_cache=False).last_hidden_state[0]
        return exact, half


def fp16_figures(out: torch.Tensor, exact: torch.Tensor, half: torch.Tensor) -> dict:
    """The accelerator's fp16 hidden states and the floor, both against float64, global and per position."""
    return {**compare.figures("vs_f64", out, exact), **compare.figures("floor_vs_f64", half, exact)}


def finite(outputs: dict) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in outputs.values())


LIMITS = ("max_rel_fp32", "max_rel_per_position_fp32", "fp16_max_over_floor")


def limits(section) -> dict[str, float]:
    """params.yaml `verify_gpu` -> {max_rel_fp32, max_rel_per_position_fp32, fp16_max_over_floor}, each a
    positive number."""
    return params.positive_numbers(section, LIMITS, "verify_gpu")


def compile_modes(path, census: dict | None = None) -> dict:
    """{mode: Compiled} for both modes; a refusal is a ClefError from gpu_accelerator.compile."""
    return {mode: gpu_accelerator.compile(path, enforce, census) for mode, enforce in MODES.items()}


# Each check in two halves: its torch references first (while the stack is loaded), then its rows from
# the compiled graph (after the stack is freed), so the weights are never in memory twice.


def row_references(model, host: Host, stock: StockReferences, records: dict) -> dict:
    """records: {kind: (n, inputs)} -> {kind: the torch row graph's hidden, stock float64 and float16
    hidden, each [n, H]}."""
    length = next(iter(records.values()))[1]["valid"].shape[-1]
    graph = ClefRowPrefill(model, length).eval()
    out = {}
    for kind, (n, inputs) in records.items():
        with torch.no_grad():
            ref = graph(**inputs)["hidden"][0, :n]
        exact, half = stock.hidden(inputs["embeds"][:, :n])
        out[kind] = {"torch": ref, "exact": exact, "half": half}
    return out


def row_rows(compiled: dict, references: dict, records: dict) -> list[dict]:
    """One row per record and mode (`references` from row_references)."""
    rows = []
    for mode, c in compiled.items():
        for kind, (n, inputs) in records.items():
            ref = references[kind]
            outs = c.signature()(**inputs)
            out = outs["hidden"][0, :n]
            row = {
                "mode": mode,
                "record": kind,
                "n_real": n,
                "finite": finite(outs),
                **compare.figures("vs_torch", out, ref["torch"]),
            }
            if mode == "fp16":
                row.update(fp16_figures(out, ref["exact"], ref["half"]))
            rows.append(row)
    return rows


def signature_references(prefix_module, suffix_module, host: Host, P: int, S: int, ids) -> dict:
    """Each signature's inputs and torch outputs: the prefix on ids[:p], the suffix fed the torch
    prefix's state."""
    p = len(ids) // 2 or 1
    prefix_in = host.record(ids[:p], P)
    with torch.no_grad():
        ref_prefix = dict(prefix_module(**prefix_in))
    state = {k: v for k, v in ref_prefix.items() if k != "hidden"}
    suffix_in = {**host.record(ids[p : p + S], S, start=p), **state}
    with torch.no_grad():
        ref_suffix = dict(suffix_module(**suffix_in))
    return {"p": p, "prefix": (prefix_in, ref_prefix), "suffix": (suffix_in, ref_suffix)}


def signature_rows(compiled: dict, references: dict) -> list[dict]:
    """Each signature alone: every output of prefix and suffix vs torch (signature_references)."""
    rows = []
    for mode, c in compiled.items():
        for name in ("prefix", "suffix"):
            inputs, ref = references[name]
            outs = c.signature(name)(**inputs)
            per_output = {k: compare.figures("vs_torch", outs[k], ref[k], pair_graph.position_dim(k)) for k in ref}
            rows.append(
                {
                    "mode": mode,
                    "check": "signature",
                    "signature": name,
                    "p": references["p"],
                    "finite": finite(outs),
                    **{
                        key: compare.worst(per_output.values(), key)
                        for key in ("rel_vs_torch", "rel_per_position_vs_torch")
                    },
                    "per_output": per_output,
                }
            )
    return rows


def chaining_references(model, host: Host, stock: StockReferences, P: int, S: int, ids_for) -> list[dict]:
    """For p in {1, P/2, P} and s in {1, S}: the tokens, and at the suffix positions the row graph's
    hidden (torch), stock float64 and float16."""
    row = ClefRowPrefill(model, P + S).eval()
    out = []
    for p in sorted({1, P // 2, P}):
        for s in sorted({1, S}):
            ids = ids_for(p + s)
            full = host.record(ids, P + S)
            with torch.no_grad():
                ref = row(**full)["hidden"][0, p : p + s]
            exact, half = stock.hidden(full["embeds"][:, : p + s])
            out.append({"p": p, "s": s, "ids": ids, "torch": ref, "exact": exact[p:], "half": half[p:]})
    return out


def chaining_rows(
    compiled: dict, host: Host, references: list[dict], P: int, S: int, form: str, state_shapes: dict
) -> list[dict]:
    """suffix(prefix(x[:p]), x[p:p+s]) on the GPU vs the row graph (fp32) and stock float64 (fp16)."""
    rows = []
    for mode, c in compiled.items():
        runner = PairRunner(host, c.signature("prefix"), c.signature("suffix"), P, S, form, state_shapes)
        for ref in references:
            p, s, ids = ref["p"], ref["s"], ref["ids"]
            prefix_hidden, state = runner.prefix(ids[:p])
            out = runner.suffix(state, ids[p:])[0]
            r = {
                "mode": mode,
                "check": "chaining",
                "p": p,
                "s": s,
                "prefix_padded": p < P,
                "finite": bool(torch.isfinite(out).all() and torch.isfinite(prefix_hidden).all())
                and finite(state.tensors),
                **compare.figures("vs_torch", out, ref["torch"]),
            }
            if mode == "fp16":
                r.update(fp16_figures(out, ref["exact"], ref["half"]))
            rows.append(r)
    return rows


def summary(rows: list[dict], bounds: dict) -> tuple[dict, list[str]]:
    """Headline figures and the problems, one line each: not finite, fp32 over a bound (global or per
    position). The fp16 ratio to the floor is recorded against its target, not enforced."""
    fp32 = [r for r in rows if r["mode"] == "fp32"]
    problems = compare.judge([r for r in rows if r["mode"] != "fp32"], {})
    problems += compare.judge(
        fp32, {"rel_vs_torch": bounds["max_rel_fp32"], "rel_per_position_vs_torch": bounds["max_rel_per_position_fp32"]}
    )
    fp16 = [r for r in rows if "rel_vs_f64" in r]
    ratio = compare.largest([r["rel_vs_f64"] / max(r["rel_floor_vs_f64"], 1e-30) for r in fp16])
    over_floor = bounds["fp16_max_over_floor"]
    doc = {
        "fp32_max_rel_vs_torch": compare.worst(fp32, "rel_vs_torch"),
        "fp32_max_rel_per_position_vs_torch": compare.worst(fp32, "rel_per_position_vs_torch"),
        "fp16_max_rel_vs_f64": compare.worst(fp16, "rel_vs_f64"),
        "fp16_max_rel_per_position_vs_f64": compare.worst(fp16, "rel_per_position_vs_f64"),
        "floor_max_rel_vs_f64": compare.worst(fp16, "rel_floor_vs_f64"),
        "floor_max_rel_per_position_vs_f64": compare.worst(fp16, "rel_per_position_floor_vs_f64"),
        "fp16_over_floor": ratio,
        "fp16_target_over_floor": over_floor,
        "fp16_within_target": not compare.exceeds(ratio, over_floor),
        "all_finite": all(r["finite"] for r in rows),
    }
    return doc, problems
