"""The host's tables (embed_tokens, lm_head) at a release's `release.host_weights_precision`.

`bf16` keeps the checkpoint's values. `int8` and `int4` store them as the graphs store their Linear
weights, with weight_precision's formulas: one symmetric scale per row (a token's embedding, a
vocabulary entry's logit row), or, spelt `int4b32` (64, 128, 256), one per block of a row. A
release's host/model.safetensors then holds the codes under the table's own key (int8; int4 packed
two a byte, the even element in the low nibble, as uint8 [V, H / 2]) with the scales beside it
(SCALES: float32 [V]; BLOCK_SCALES: float16 [V, H / block]). `QuantizedTable` reads them back as a
table of float32 values, dequantized a slice at a time: the rows a record looks up, a block of
vocabulary rows of the lm_head (decision.log_probs, Host.logits), never the whole table at once.
"""

from __future__ import annotations

import torch

from scripts.layers import weight_precision
from scripts.pipeline.errors import ClefError
from scripts.pipeline.params import HOST_BF16, host_precision, parse_weights

BF16 = HOST_BF16
SCALES = ".scales"
BLOCK_SCALES = ".block_scales"
MEASURED = ("bf16", "int8", "int4", "int4b32")  # the precisions the benchmarks measure the tables at
_ENCODE_ROWS = 8192  # rows encoded at a time: clef-flash's tables are 2 GB in bf16, 4 GB widened


def check(precision) -> str:
    """A host precision (params.host_precision): bf16, or an integer `weights` spelling (int8, int4, int4b32 ...)."""
    return host_precision(precision)


def encode(table: torch.Tensor, precision: str) -> dict[str, torch.Tensor]:
    """A [V, H] table at `precision` -> {key suffix: tensor} to store ('' the codes, or the bf16 table)."""
    precision = check(precision)
    if precision == BF16:
        return {"": table.to(torch.bfloat16).contiguous()}
    spec = parse_weights(precision)
    if spec.block and table.shape[1] % spec.block:
        raise ClefError(f"host weights {precision}: width {table.shape[1]} is not a multiple of the block {spec.block}")
    levels = weight_precision.LEVELS[spec.precision]
    codes, scales = [], []
    for lo in range(0, table.shape[0], _ENCODE_ROWS):
        w = table[lo : lo + _ENCODE_ROWS].to(torch.float32)
        if spec.block:
            s = weight_precision.block_scales(w, spec.block)
            q = weight_precision.block_codes(w, s)
            scales.append(s.to(torch.float16))
        else:
            s = weight_precision.row_scales(w, levels)
            q = weight_precision.row_codes(w, s, levels)
            scales.append(s.reshape(-1).to(torch.float32))
        codes.append(_pack(q) if spec.precision == "int4" else q.to(torch.int8))
    return {"": torch.cat(codes), (BLOCK_SCALES if spec.block else SCALES): torch.cat(scales)}


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [n, H] (H even) -> uint8 [n, H / 2]: weight_storage.pack_int4's layout, row by row."""
    from scripts.litert.weight_storage import pack_int4

    return torch.from_numpy(pack_int4(codes.to(torch.int8).numpy())).reshape(codes.shape[0], -1)


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [n, H / 2] -> int4 codes [n, H] as float32 (sign-extended)."""
    p = packed.to(torch.int16)
    pair = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(packed.shape[0], -1)
    return torch.where(pair > 7, pair - 16, pair).to(torch.float32)


class QuantizedTable:
    """A stored integer table read as float32 values a slice at a time: table[ids], table[lo:hi]."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, packed: bool):
        self.codes, self.scales, self.packed = codes, scales, packed
        width = codes.shape[1] * (2 if packed else 1)
        self.shape = torch.Size([codes.shape[0], width])
        self.block = width // scales.shape[1] if scales.dim() == 2 else None
        self.precision = ("int4" if packed else "int8") + (f"b{self.block}" if self.block else "")

    def __getitem__(self, rows) -> torch.Tensor:
        codes, scales = self.codes[rows], self.scales[rows].to(torch.float32)
        single = codes.dim() == 1
        if single:
            codes, scales = codes[None], scales[None]
        values = _unpack(codes) if self.packed else codes.to(torch.float32)
        if self.block:
            values = (values.reshape(values.shape[0], -1, self.block) * scales[..., None]).reshape(values.shape)
        else:
            values = values * scales.reshape(-1, 1)
        return values[0] if single else values

    def to(self, dtype) -> torch.Tensor:
        """The whole table dequantized (small tables only: the tests, the tiny checkpoint)."""
        return self[:].to(dtype)


def read(mapped: dict[str, torch.Tensor], key: str):
    """The table `key` of a host safetensors file's tensors (`mapped`: name -> tensor): the bf16 tensor, or
    a QuantizedTable where its scales are beside it."""
    if key + SCALES in mapped:
        return QuantizedTable(mapped[key], mapped[key + SCALES], mapped[key].dtype == torch.uint8)
    if key + BLOCK_SCALES in mapped:
        return QuantizedTable(mapped[key], mapped[key + BLOCK_SCALES], True)
    if mapped[key].dtype in (torch.int8, torch.uint8):
        raise ClefError(f"{key} holds integer codes without their scales ({key}{SCALES} or {key}{BLOCK_SCALES})")
    return mapped[key]


def stored_bytes(shape: tuple[int, int], precision: str) -> int:
    """The bytes a [V, H] table takes at `precision` (codes and scales): the release's host file, extrapolated."""
    v, h = shape
    if check(precision) == BF16:
        return 2 * v * h
    spec = parse_weights(precision)
    codes = v * h // (2 if spec.precision == "int4" else 1)
    return codes + (2 * v * (h // spec.block) if spec.block else 4 * v)


def at(host, precision: str):
    """`host` with both tables at `precision` (encoded and read back in memory): what a release stored at
    release.host_weights_precision gives its host."""
    from scripts.qwen35.checkpoint_layout import EMBED_TOKENS, LM_HEAD

    tables = {}
    for key, table in ((EMBED_TOKENS, host.embed_tokens), (LM_HEAD, host.lm_head)):
        tables[key] = read({key + k: v for k, v in encode(table, precision).items()}, key)
    return host.with_tables(tables)
