"""The host side of a row graph: what a device does around the `.tflite`.

token ids -> `embeds` (the bf16 embed_tokens rows widened to fp32, pad rows 0), `valid`, and the
M-RoPE `cos`/`sin` tables for text positions (i, i, i) from any start (pairs continue at an offset),
padded to the graph's L; and `hidden` -> logits with the lm_head (bf16, or a release's int8 or int4 host
tables dequantized: scripts/qwen35/host_tables.py). The rotary tables repeat
transformers' float32 arithmetic step for step (inverse frequencies, position x frequency, the
interleave of the T/H/W sections), because at position 1000 a float64 table already differs from the
model's own by ~1e-5.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch

from scripts.checkpoint.snapshot import check_tokenizer, read_json, text_config
from scripts.pipeline.errors import ClefError
from scripts.pipeline.mappings import Shapes, Tensors
from scripts.qwen35 import host_tables
from scripts.qwen35.checkpoint_layout import EMBED_TOKENS, LM_HEAD, rotary_width


def inverse_frequencies(rope: dict, head_dim: int) -> torch.Tensor:
    """[R/2] float32, as transformers computes them for rope_type default."""
    if rope.get("rope_type", "default") != "default":
        raise ClefError(f"rope_type {rope.get('rope_type')!r} is not supported by the host (default only)")
    dim = rotary_width(head_dim, rope)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (rope["rope_theta"] ** exponents)


def rope_tables(rope: dict, head_dim: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, R] for M-RoPE positions [3, n] (T, H, W; a text token has all three equal)."""
    if not rope.get("mrope_interleaved", False):
        raise ClefError("only interleaved M-RoPE (mrope_interleaved: true, as in Qwen3.5) is supported by the host")
    inv = inverse_frequencies(rope, head_dim)
    freqs = positions.to(torch.float32)[:, :, None] * inv[None, None, :]  # [3, n, R/2]
    section = rope["mrope_section"]
    out = freqs[0].clone()  # T everywhere, then H and W on their interleaved slots
    for axis in (1, 2):
        slots = slice(axis, section[axis] * 3, 3)
        out[:, slots] = freqs[axis][:, slots]
    emb = torch.cat([out, out], dim=-1)
    return emb.cos(), emb.sin()


def text_positions(start: int, n: int) -> torch.Tensor:
    """[3, n]: positions (i, i, i) for i = start .. start + n - 1."""
    return torch.arange(start, start + n).expand(3, n)


def check_inputs(embeds, valid, cos, sin, length: int, hidden_size: int, rotary: int) -> int:
    """Refuse what a row graph of length L cannot take, before it runs; -> the record's real length."""
    if tuple(embeds.shape) != (1, length, hidden_size):
        if embeds.dim() == 3 and embeds.shape[-1] != hidden_size:
            raise ClefError(f"embeds have width {embeds.shape[-1]}, the graph takes {hidden_size}")
        raise ClefError(
            f"embeds of shape {list(embeds.shape)} do not fit a graph of L={length}: "
            f"expected [1, {length}, {hidden_size}]"
        )
    if tuple(valid.shape) != (1, length):
        raise ClefError(
            f"valid of shape {list(valid.shape)} does not fit a graph of L={length}: expected [1, {length}]"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (1, length, rotary):
            raise ClefError(f"{name} of shape {list(t.shape)} does not fit: expected [1, {length}, {rotary}]")
    v = valid[0]
    if not bool(((v == 0) | (v == 1)).all()):
        raise ClefError("valid must hold only 0.0 and 1.0")
    n = int(v.sum())
    if n == 0 or v[0] != 1:
        raise ClefError("valid must start with 1.0: a record starts at position 0 and has at least one token")
    if not bool((v[:n] == 1).all()):
        raise ClefError(
            f"valid has a hole: {n} ones but not all before the first 0 (pads go only after the last token)"
        )
    return n


# safetensors dtype -> (numpy dtype of the same width, torch dtype); bf16 is read as int16 and viewed
SAFETENSORS_DTYPES = {
    "BF16": (np.int16, torch.bfloat16),
    "F16": (np.float16, torch.float16),
    "F32": (np.float32, torch.float32),
    "I8": (np.int8, torch.int8),  # int8 and packed int4 host tables' codes (scripts/qwen35/host_tables.py)
    "U8": (np.uint8, torch.uint8),
}


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size))


class MappedSafetensors:
    """A safetensors file's tensors by name, each mapped when it is asked for (mapped_tensor)."""

    def __init__(self, path: Path):
        self.path, self.names = path, set(safetensors_header(path)) - {"__metadata__"}

    def __contains__(self, key: str) -> bool:
        return key in self.names

    def __getitem__(self, key: str) -> torch.Tensor:
        return mapped_tensor(self.path, key)


def mapped_tensor(path: Path, key: str) -> torch.Tensor:
    """Tensor `key` of a safetensors file as a view of the file's pages, nothing read up front: a row is
    read when it is used, and the kernel can drop its page again (clef-flash's embed_tokens is 2 GB in
    bf16, of which a record uses a few rows). Copy-on-write: writing to it changes nothing on disk."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    if key not in header:
        raise ClefError(f"{path} has no tensor {key}")
    entry = header[key]
    if entry["dtype"] not in SAFETENSORS_DTYPES:
        raise ClefError(f"{path}: {key} is {entry['dtype']}, the host reads {sorted(SAFETENSORS_DTYPES)}")
    np_dtype, dtype = SAFETENSORS_DTYPES[entry["dtype"]]
    start, _ = entry["data_offsets"]
    array = np.memmap(path, dtype=np_dtype, mode="c", offset=8 + size + start, shape=tuple(entry["shape"]))
    return torch.from_numpy(array).view(dtype)


class Host:
    """The host-side tables of one snapshot: embed_tokens, lm_head, tokenizer, rope settings."""

    def __init__(self, snapshot: Path, weights: Path | None = None):
        """`snapshot`: a checkpoint directory, or a release's host/ directory (config, tokenizer and
        model.safetensors holding only embed_tokens and lm_head); `weights`: where the tables are read
        from when not beside the config (a release that references them instead of including them)."""
        self.snapshot = Path(snapshot)
        self.weights = Path(weights) if weights is not None else self.snapshot
        config = text_config(self.snapshot)
        self.hidden_size = config["hidden_size"]
        self.head_dim = config["head_dim"]
        self.rope = config["rope_parameters"]
        self.rotary = rotary_width(self.head_dim, self.rope)
        self._tables: dict = {}
        self._tokenizer = None

    def _tensor(self, key: str) -> torch.Tensor:
        if key not in self._tables:
            index = self.weights / "model.safetensors.index.json"
            name = read_json(index)["weight_map"][key] if index.is_file() else "model.safetensors"
            if not (self.weights / name).is_file():
                raise ClefError(f"no {key} here: {self.weights / name} is missing")
            self._tables[key] = host_tables.read(MappedSafetensors(self.weights / name), key)
        return self._tables[key]

    def with_tables(self, tables: dict) -> Host:
        """This host with other tables ({EMBED_TOKENS or LM_HEAD: table}): a release's host tables at
        another precision (scripts/qwen35/host_tables.py), held in memory."""
        other = copy.copy(self)
        other._tables = {**self._tables, **tables}
        return other

    @property
    def embed_tokens(self) -> torch.Tensor:
        return self._tensor(EMBED_TOKENS)

    @property
    def lm_head(self) -> torch.Tensor:
        return self._tensor(LM_HEAD)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            check_tokenizer(self.snapshot)  # unparsable: one line, not a traceback
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.snapshot))
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def record(self, ids, length: int, start: int = 0) -> Tensors:
        """Row graph inputs for token ids, right-padded to `length`, positions from `start`."""
        n = len(ids)
        if n == 0:
            raise ClefError("a record needs at least one token")
        if n > length:
            raise ClefError(f"{n} tokens do not fit a graph of L={length}")
        vocab = self.embed_tokens.shape[0]
        if min(ids) < 0 or max(ids) >= vocab:
            raise ClefError(f"token id out of range 0..{vocab - 1}")
        embeds = torch.zeros(1, length, self.hidden_size)
        embeds[0, :n] = self.embed_tokens[torch.tensor(ids)].to(torch.float32)
        valid = torch.zeros(1, length)
        valid[0, :n] = 1.0
        cos, sin = rope_tables(self.rope, self.head_dim, text_positions(start, length))
        return {"embeds": embeds, "valid": valid, "cos": cos[None], "sin": sin[None]}

    def check(self, inputs: Tensors, length: int) -> int:
        """Refuse inputs a graph of this checkpoint and length L cannot take; -> the real length."""
        return check_inputs(
            inputs["embeds"], inputs["valid"], inputs["cos"], inputs["sin"], length, self.hidden_size, self.rotary
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states [..., H] -> logits [..., V] with the lm_head widened to fp32."""
        return hidden @ self.lm_head.to(torch.float32).T


class PairState:
    """A pair's model state as the host keeps it: the tensors, and what they are valid for.

    The vs scale is part of the contract: under vs<k> the recurrent states are 2^k x stock, so a
    state from one form must never be fed to a graph of another scale; the host refuses it."""

    def __init__(self, tensors: Tensors, form: str, v_scale_log2: int, real_length: int):
        self.tensors, self.form, self.vs, self.real_length = tensors, form, v_scale_log2, real_length


class PairRunner:
    """Runs a pair: `prefix` and `suffix` are callables taking named float32 tensors and returning a
    dict of them (a torch module, or a LiteRT signature runner wrapped by `litert_signature`)."""

    def __init__(
        self, host: Host, prefix_fn, suffix_fn, prefix_len: int, suffix_len: int, form: str, state_shapes: Shapes
    ):
        from scripts.layers.kernel_form import parse

        self.host, self.prefix_fn, self.suffix_fn = host, prefix_fn, suffix_fn
        self.P, self.S, self.form, self.vs = prefix_len, suffix_len, form, parse(form).vs
        self.state_shapes = state_shapes  # name -> shape the suffix expects

    def prefix(self, ids) -> tuple[torch.Tensor, PairState]:
        return self.prefix_result(self.prefix_fn(**self.prefix_inputs(ids)), len(ids))

    def prefix_inputs(self, ids) -> Tensors:
        if len(ids) > self.P:
            raise ClefError(f"a prefix of {len(ids)} tokens is longer than the pair's P={self.P}")
        return self.host.record(ids, self.P)

    def prefix_result(self, out: Tensors, n: int) -> tuple[torch.Tensor, PairState]:
        """The prefix signature's outputs for n real tokens -> (hidden [1, n, H], the state)."""
        hidden = out.pop("hidden")
        return hidden[:, :n], PairState(out, self.form, self.vs, n)

    def suffix(self, state: PairState, ids) -> torch.Tensor:
        return self.suffix_fn(**self.suffix_inputs(state, ids))["hidden"][:, : len(ids)]

    def suffix_inputs(self, state: PairState, ids) -> Tensors:
        if len(ids) > self.S:
            raise ClefError(f"a suffix of {len(ids)} tokens is longer than the pair's S={self.S}")
        if state.vs != self.vs:
            raise ClefError(
                f"state was produced under {state.form} (recurrent state x 2^{state.vs}); this pair "
                f"runs {self.form} and needs x 2^{self.vs}: refusing a mis-scaled state"
            )
        for name, shape in self.state_shapes.items():
            got = state.tensors.get(name)
            if got is None or tuple(got.shape) != tuple(shape):
                raise ClefError(
                    f"state tensor {name} has shape {None if got is None else list(got.shape)}, "
                    f"the suffix takes {list(shape)}"
                )
        return {**self.host.record(ids, self.S, start=state.real_length), **state.tensors}


def litert_signature(runner):
    """A LiteRT signature runner as a callable on torch tensors."""
    import numpy as np

    def call(**inputs):
        out = runner(**{k: v.numpy().astype(np.float32) for k, v in inputs.items()})
        return {k: torch.from_numpy(v.copy()) for k, v in out.items()}

    return call
