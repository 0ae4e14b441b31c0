"""The precision a graph stores its Linear weights at (params.yaml `weights`), as torch sees it.

The quantization is done here, once, in torch, before anything is converted: every nn.Linear weight
of the stack is replaced by the values the stored weight stands for (`fp16`: rounded to float16;
`int8`: per output channel, symmetric, scale = max |row| / 127, q = round(w / scale) in [-127, 127],
the value q x scale in float32; `int4`: the same with 7 levels, q in [-7, 7], one float32 scale per row,
or, spelt `int4b32`, one scale per block of 32 inputs of a row, rounded to bfloat16 and stored as float16,
as ai-edge-quantizer's blockwise recipes do). The converter then folds those values into the graph as float32,
and scripts/litert/weight_storage.py re-encodes each of them in the smaller type, exactly (it checks
that every element round-trips). So the torch model that references a graph computes with the very
weights the graph holds, and a graph's error against it is conversion error alone; the unquantized
model gives the quantization's effect, a separate figure.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from scripts.pipeline.errors import ClefError
from scripts.pipeline.params import block_unfit, parse_weights
from scripts.pipeline.records import Record

FP16_MAX = float(np.finfo(np.float16).max)
INT8_LEVELS = 127  # symmetric: q in [-127, 127], zero point 0
INT4_LEVELS = 7  # symmetric: q in [-7, 7] (int4's -8 unused, as ai-edge-quantizer's symmetric recipes)
LEVELS = {"int8": INT8_LEVELS, "int4": INT4_LEVELS}  # the integer precisions
FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).smallest_normal)


@dataclasses.dataclass(frozen=True)
class Applied(Record):
    """What `apply` changed: how many Linear weights and elements, and how many elements moved (a
    graph's verification figures and the weights bench hold it as JSON)."""

    precision: str
    linears: int
    elements: int
    changed: int  # elements whose value is not the float32 one
    max_abs_change: float


def row_scales(w: torch.Tensor, levels: int = INT8_LEVELS) -> torch.Tensor:
    """float32 [out, in] -> the per-output-channel scales [out] (1 for an all-zero row)."""
    absmax = w.abs().amax(dim=1)
    return torch.where(absmax > 0, absmax / levels, torch.ones_like(absmax))


def row_codes(w: torch.Tensor, scales: torch.Tensor, levels: int = INT8_LEVELS) -> torch.Tensor:
    """float32 [out, in] and scales [out] -> int8 codes [out, in] (int4's too, in [-7, 7])."""
    return torch.round(w / scales[:, None]).clamp(-levels, levels).to(torch.int8)


def integer(weights: str) -> bool:
    """Whether `weights` (a params spelling) stores the Linear weights as integer codes and scales."""
    return parse_weights(weights).precision in LEVELS


def block_scales(w: torch.Tensor, block: int) -> torch.Tensor:
    """float32 [out, in] -> the scales [out, in / block] of int4 blockwise as float32: max |block| / 7 rounded
    to bfloat16 (XNNPACK's blockwise kernels read the scales as bfloat16; the graph stores them as float16,
    which holds every such value from float16's smallest normal up), at least that smallest normal; 1 for
    an all-zero block."""
    absmax = w.reshape(w.shape[0], -1, block).abs().amax(dim=2)
    scales = (absmax / INT4_LEVELS).to(torch.bfloat16).to(torch.float32).clamp(min=FP16_SMALLEST_NORMAL)
    return torch.where(absmax > 0, scales, torch.ones_like(scales))


def block_codes(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [out, in] and block scales [out, in / block] -> int4 codes in int8 [out, in]."""
    block = w.shape[1] // scales.shape[1]
    q = torch.round(w.reshape(w.shape[0], -1, block) / scales[..., None]).clamp(-INT4_LEVELS, INT4_LEVELS)
    return q.reshape(w.shape).to(torch.int8)


def check(w: torch.Tensor, weights: str, name: str = "weight") -> None:
    """Refuse, naming the tensor, a Linear weight that cannot be stored at `weights` (a params spelling)."""
    spec = parse_weights(weights)
    if spec.precision == "fp16" and w.numel():
        big = float(w.detach().abs().max())
        if big > FP16_MAX:
            raise ClefError(f"weights fp16: {name} holds {big:.4g}, over float16's largest value {FP16_MAX:g}")
    if spec.precision in LEVELS and w.dim() != 2:
        raise ClefError(f"weights {spec}: {name} has shape {tuple(w.shape)}, not [out, in]")
    if problem := block_unfit(weights, name, w.shape[1]):
        raise ClefError(problem)


def stored_values(w: torch.Tensor, weights: str, name: str = "weight") -> torch.Tensor:
    """The float32 values a Linear weight `w` [out, in] holds once stored at `weights`."""
    check(w, weights, name)
    spec = parse_weights(weights)
    w = w.detach().to(torch.float32)
    if spec.precision == "fp16":
        return w.to(torch.float16).to(torch.float32)
    if spec.block:
        scales = block_scales(w, spec.block)
        return (
            block_codes(w, scales).to(torch.float32).reshape(w.shape[0], -1, spec.block) * scales[..., None]
        ).reshape(w.shape)
    if spec.precision in LEVELS:
        levels = LEVELS[spec.precision]
        scales = row_scales(w, levels)
        return row_codes(w, scales, levels).to(torch.float32) * scales[:, None]
    return w


def linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def apply(model: nn.Module, precision: str) -> Applied:
    """Every nn.Linear weight of `model` replaced in place by its stored values at `precision` (a params
    `weights` spelling, recorded as given): all
    are checked before any changes (a float16 overflow is refused, naming the module), then one
    weight at a time is replaced, so at most one extra weight is in memory."""
    found = linears(model)
    for name, m in found:
        check(m.weight, precision, f"{name}.weight")
    elements = changed = 0
    worst = 0.0
    with torch.no_grad():
        for name, m in found:
            new = stored_values(m.weight, precision, f"{name}.weight")
            diff = (new - m.weight.to(torch.float32)).abs()
            elements += diff.numel()
            changed += int((diff > 0).sum())
            worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
            m.weight.copy_(new.to(m.weight.dtype))
            del new, diff
    return Applied(precision, len(found), elements, changed, worst)
