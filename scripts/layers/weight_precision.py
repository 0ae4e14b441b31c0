"""The precision a graph stores its Linear weights at (params.yaml `weights`), as torch sees it.

The quantization is done here, once, in torch, before anything is converted: every nn.Linear weight
of the stack is replaced by the values the stored weight stands for (`fp16`: rounded to float16;
`int8`: per output channel, symmetric, scale = max |row| / 127, q = round(w / scale) in [-127, 127],
the value q x scale in float32). The converter then folds those values into the graph as float32,
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
from scripts.pipeline.params import WEIGHT_PRECISIONS
from scripts.pipeline.records import Record

FP16_MAX = float(np.finfo(np.float16).max)
INT8_LEVELS = 127  # symmetric: q in [-127, 127], zero point 0


@dataclasses.dataclass(frozen=True)
class Applied(Record):
    """What `apply` changed: how many Linear weights and elements, and how many elements moved (a
    graph's verification figures and the weights bench hold it as JSON)."""

    precision: str
    linears: int
    elements: int
    changed: int  # elements whose value is not the float32 one
    max_abs_change: float


def int8_scales(w: torch.Tensor) -> torch.Tensor:
    """float32 [out, in] -> the per-output-channel scales [out] (1 for an all-zero row)."""
    absmax = w.abs().amax(dim=1)
    return torch.where(absmax > 0, absmax / INT8_LEVELS, torch.ones_like(absmax))


def int8_codes(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [out, in] and scales [out] -> int8 codes [out, in]."""
    return torch.round(w / scales[:, None]).clamp(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)


def check(w: torch.Tensor, precision: str, name: str = "weight") -> None:
    """Refuse, naming the tensor, a Linear weight that cannot be stored at `precision`."""
    if precision not in WEIGHT_PRECISIONS:
        raise ClefError(f"weights {precision!r} is not one of {', '.join(WEIGHT_PRECISIONS)}")
    if precision == "fp16" and w.numel():
        big = float(w.detach().abs().max())
        if big > FP16_MAX:
            raise ClefError(f"weights fp16: {name} holds {big:.4g}, over float16's largest value {FP16_MAX:g}")
    if precision == "int8" and w.dim() != 2:
        raise ClefError(f"weights int8: {name} has shape {tuple(w.shape)}, not [out, in]")


def stored_values(w: torch.Tensor, precision: str, name: str = "weight") -> torch.Tensor:
    """The float32 values a Linear weight `w` [out, in] holds once stored at `precision`."""
    check(w, precision, name)
    w = w.detach().to(torch.float32)
    if precision == "fp16":
        return w.to(torch.float16).to(torch.float32)
    if precision == "int8":
        scales = int8_scales(w)
        return int8_codes(w, scales).to(torch.float32) * scales[:, None]
    return w


def linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def apply(model: nn.Module, precision: str) -> Applied:
    """Every nn.Linear weight of `model` replaced in place by its stored values at `precision`: all
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
