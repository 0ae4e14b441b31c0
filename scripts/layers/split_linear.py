"""Linear layers whose weight is larger than a byte limit, split by output rows for the export.

A GPU binds each constant tensor as one storage buffer, and LiteRT's GPU accelerator does not refuse
a tensor over the device's binding limit: it computes the FULLY_CONNECTED wrong (tests/
test_gpu_accelerator.py). clef-flash's MLP weights are over WebGPU's default limit
(scripts/litert/tflite_file.py MAX_CONSTANT_BYTES). `split_linears` switches every such nn.Linear,
for the duration of a conversion, to `SplitLinear`: the weight's row blocks as separate
non-persistent buffers (views: no copy) and one matmul per block, concatenated. Every output element
is the same dot product as before (a kernel may sum it in another order); the module is restored
afterwards, however the block is left, so torch checks never see the split.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

PIECE = "weight_piece_{}"
BIAS_PIECE = "bias_piece_{}"


class SplitLinear(nn.Linear):
    """nn.Linear computed block by block of output rows (the blocks: `pieces` buffers)."""

    pieces: int

    def forward(self, x):
        outs = []
        for i in range(self.pieces):
            bias = getattr(self, BIAS_PIECE.format(i)) if self.bias is not None else None
            outs.append(F.linear(x, getattr(self, PIECE.format(i)), bias))
        return torch.cat(outs, dim=-1)


def row_blocks(out_features: int, row_bytes: int, max_bytes: int) -> int:
    """Rows per block: the fewest equal blocks of at most max_bytes each."""
    if row_bytes > max_bytes:
        raise ValueError(f"one weight row is {row_bytes} bytes, over the {max_bytes}-byte limit")
    blocks = math.ceil(out_features * row_bytes / max_bytes)
    return math.ceil(out_features / blocks)


def _split(m: nn.Linear, max_bytes: int) -> None:
    weight = m.weight.detach()
    rows = row_blocks(m.out_features, weight[0].numel() * weight.element_size(), max_bytes)
    pieces = weight.split(rows, dim=0)
    for i, piece in enumerate(pieces):
        m.register_buffer(PIECE.format(i), piece, persistent=False)
    if m.bias is not None:
        for i, piece in enumerate(m.bias.detach().split(rows, dim=0)):
            m.register_buffer(BIAS_PIECE.format(i), piece, persistent=False)
    m.pieces = len(pieces)
    m.__class__ = SplitLinear


def _restore(m: SplitLinear) -> None:
    for i in range(m.pieces):
        for name in (PIECE.format(i), BIAS_PIECE.format(i)):
            m._buffers.pop(name, None)
            m._non_persistent_buffers_set.discard(name)
    del m.pieces
    m.__class__ = nn.Linear


@contextlib.contextmanager
def split_linears(modules, max_bytes: int):
    """Inside the block, every nn.Linear of `modules` (shared ones once) whose weight is over
    `max_bytes` is a SplitLinear; -> the number split."""
    seen = {}
    for module in modules:
        for m in module.modules():
            if type(m) is nn.Linear and m.weight.numel() * m.weight.element_size() > max_bytes:
                seen[id(m)] = m
    done = []
    try:
        for m in seen.values():
            _split(m, max_bytes)
            done.append(m)
        yield len(done)
    finally:
        for m in done:
            _restore(m)
