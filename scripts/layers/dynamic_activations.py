"""What LiteRT's CPU does to a Linear's input when the graph stores the weight as int8 or int4.

A FULLY_CONNECTED that reads integer weights itself (scripts/litert/weight_storage.py, the dynamic
scheme) runs on the CPU as XNNPACK's dynamic kernels: each row of the input (one position) is
quantized to int8, asymmetrically, from its own range, and the products are accumulated in integers.
`quantized_rows` gives the float values that quantization leaves, so a torch model whose Linears
read them (model_change.changed(dynamic_activations=True)) computes the CPU's arithmetic: to float32
rounding for one position, while over many positions a few codes that float32's reordering puts on
the other side of a rounding boundary move the result by whole int8 steps (docs/release.md, "Weights").
The GPU accelerator reads the same weights with float activations: its reference is the plain model.

The rule is XNNPACK's (xnn_f32_qd8_asymmetric_quantization_params): the range is widened to hold 0,
inv_scale = 255 / (max - min), the zero point taken from the end with the smaller error, clamped to
[-128, 127] and rounded, q = clamp(round(x inv_scale) + zero point); rounding is to nearest even.
"""

from __future__ import annotations

import torch

QMIN, QMAX = -128.0, 127.0


def quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` [..., in] with each row as the CPU's dynamic kernel holds it: (q - zero point) / inv_scale, in x's dtype."""
    f = x.to(torch.float32)
    lo = f.amin(-1, keepdim=True).clamp(max=0)
    hi = f.amax(-1, keepdim=True).clamp(min=0)
    inv = torch.where(lo == hi, torch.ones_like(lo), (QMAX - QMIN) / (hi - lo))
    at_lo, at_hi = lo * inv, hi * inv
    zero = torch.where((QMIN + at_lo) + (QMAX + at_hi) > 0, QMIN - at_lo, QMAX - at_hi)
    zero = torch.round(zero.clamp(QMIN, QMAX))
    q = torch.clamp(torch.round(f * inv) + zero, QMIN, QMAX)
    return ((q - zero).to(torch.float64) / inv.to(torch.float64)).to(x.dtype)
