"""A stack run in another dtype (float64 for the exact reference, float16 for the half-precision
floor) holding one layer's converted weights at a time.

Inside `cast_by_layer(root, layers, dtype)`, the tensors of `root` outside `layers` (the final norm,
rotary frequencies, a graph's constants: small) are in `dtype`; each layer's own are converted when
the layer is called and put back when it returns. The module computes exactly what a converted copy
(`copy.deepcopy(root).to(dtype)`) computes, with the fp32 stack plus one layer in `dtype` in memory
instead of a second whole stack (a float64 copy is twice the fp32 stack). Everything is as it was
after the block, whatever happens inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from torch import nn

from scripts.pipeline import profile

PART = {torch.float64: "float64 truth", torch.float16: "float16 floor"}


def _convert(modules: Iterable[nn.Module], dtype: torch.dtype) -> list[tuple]:
    """Floating-point parameters (their .data: the Parameter objects stay) and buffers of `modules`
    in `dtype`; -> what undoes it."""
    undo = []
    for m in modules:
        for p in m._parameters.values():
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                undo.append((p, p.data))
                p.data = p.data.to(dtype)
        for name, b in m._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                undo.append((m, name, b))
                m._buffers[name] = b.to(dtype)
    return undo


def _restore(undo: list[tuple]) -> None:
    for entry in reversed(undo):
        if len(entry) == 2:
            entry[0].data = entry[1]
        else:
            module, name, b = entry
            module._buffers[name] = b


@contextlib.contextmanager
def cast_by_layer(root: nn.Module, layers: Iterable[nn.Module], dtype: torch.dtype):
    """`root` computing in `dtype` inside the block, one of `layers` converted at a time (module doc)."""
    layers = list(layers)
    inside = {id(m) for layer in layers for m in layer.modules()}
    pending: dict[int, list] = {}

    def before(layer, args, kwargs):
        pending[id(layer)] = _convert(layer.modules(), dtype)

    def after(layer, args, kwargs, output):
        _restore(pending.pop(id(layer), []))  # [] when a hook before ours raised

    handles = []
    outer = []
    try:
        for layer in layers:
            handles.append(layer.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(layer.register_forward_hook(after, with_kwargs=True, always_call=True))
        outer = _convert((m for m in root.modules() if id(m) not in inside), dtype)
        with profile.part(PART.get(dtype, "torch")):
            yield root
    finally:
        for h in handles:
            h.remove()
        for undo in pending.values():  # a layer that raised before its hook could put it back
            _restore(undo)
        _restore(outer)
