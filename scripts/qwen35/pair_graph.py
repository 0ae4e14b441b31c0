"""Shared-state pairs: a prefix graph and a suffix graph that pass the model state explicitly.

    prefix(embeds [1, P, H], valid [1, P], cos, sin) -> hidden [1, P, H] + state
    suffix(embeds [1, S, H], valid [1, S], cos, sin, state) -> hidden [1, S, H] + state'

State, every tensor rank <= 4, fp32, named for what it is (i = the decoder layer's index):
  gdn{i}_conv       [1, conv_dim, K-1]   the last K-1 conv inputs before the first unprocessed token
  gdn{i}_recurrent  [1, Hv, Dk, Dv]      the delta-rule state, 2^k x stock under a vs<k> form
  attn{i}_k, attn{i}_v  [1, Hkv, slots, D]  keys (after k_norm and rotary) and values of every slot
  attn_slots        [1, slots]           1.0 where a slot holds a real token (the same for every
                                         attention layer, so stated once)
No output is a copy of an input or of another output: LiteRT's CompiledModel names two outputs that
share a tensor after one of them, and its GPU accelerator leaves an output that is an input unwritten.
The prefix state has P slots; the suffix returns the state after its own last real token, with
P + S slots. After a right-padded prefix the state is the state at its last real token: pads add
nothing to the recurrent state (pad guard), and the conv state is gathered from the last real
inputs with a one-hot selection (a matmul, no GATHER op).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch import nn

from scripts.pipeline.mappings import Shapes, Tensors
from scripts.pipeline.records import Record
from scripts.qwen35.patch import clef_eager_attention
from scripts.qwen35.row_graph import MASKED, TensorSpec, causal_constant

SLOTS = "attn_slots"


def gdn_step(m, hidden, valid, conv_state, recurrent_state, select_grid):
    """One GatedDeltaNet over L tokens from a given state -> (out, conv_state', recurrent_state').
    select_grid: the constant [1, K-1+L, K-1] of (position - offset) values for the conv selection."""
    keep, mixed_qkv, z, beta, a = m.project(hidden, valid)
    extended = torch.cat([conv_state, mixed_qkv.transpose(1, 2)], dim=-1)  # [B, C, K-1+L], zero at pads
    conv = F.silu(F.conv1d(extended, m.conv1d.weight, groups=extended.shape[1])).transpose(1, 2) * keep
    # new conv state: extended positions n .. n+K-2, n = real tokens, by a one-hot selection matmul
    n = valid.sum(dim=-1, keepdim=True)[:, :, None]  # [B, 1, 1]; small integers are exact in fp32
    select = (select_grid == n).to(hidden.dtype)  # [B, K-1+L, K-1]: 1 where position = n + offset
    out, new_state = m.mix(conv, z, beta, a, initial_state=recurrent_state, output_final_state=True)
    return out, extended @ select, new_state


def attention_step(m, hidden, cos, sin, mask, past_k=None, past_v=None):
    """Qwen3.5 attention (output gate, q/k norm, partial rotary) over L tokens after past slots
    -> (out, keys of every slot, values of every slot)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

    b, length, _ = hidden.shape
    q, gate = torch.chunk(m.q_proj(hidden).view(b, length, -1, m.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(b, length, -1)
    q = m.q_norm(q).transpose(1, 2)
    k = m.k_norm(m.k_proj(hidden).view(b, length, -1, m.head_dim)).transpose(1, 2)
    v = m.v_proj(hidden).view(b, length, -1, m.head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if past_k is not None:
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
    out, _ = clef_eager_attention(m, q, k, v, mask, scaling=m.scaling)
    out = out.reshape(b, length, -1) * torch.sigmoid(gate)
    return m.o_proj(out), k, v


def position_dim(name: str) -> int | None:
    """The axis of a pair output that runs over positions (tokens, or attention slots), for the
    per-position error; None for one without (a recurrent state, the slot flags)."""
    if name == "hidden" or name.endswith("_k") or name.endswith("_v"):
        return -2
    if name.endswith("_conv"):
        return -1
    return None


def state_names(model) -> list[str]:
    names = []
    for i, layer in enumerate(model.layers):
        if layer.block_type == "linear_attention":
            names += [f"gdn{i}_conv", f"gdn{i}_recurrent"]
        else:
            names += [f"attn{i}_k", f"attn{i}_v"]
    return names + [SLOTS]


def zero_state(model, slots: int = 0) -> Tensors:
    """The state before any token: zeros, with `slots` empty attention slots."""
    cfg = model.config
    state: Tensors = {}
    for i, layer in enumerate(model.layers):
        if layer.block_type == "linear_attention":
            m = layer.linear_attn
            state[f"gdn{i}_conv"] = torch.zeros(1, m.conv_dim, m.conv_kernel_size - 1)
            state[f"gdn{i}_recurrent"] = torch.zeros(1, m.num_v_heads, m.head_k_dim, m.head_v_dim)
        else:
            shape = (1, cfg.num_key_value_heads, slots, layer.self_attn.head_dim)
            state[f"attn{i}_k"], state[f"attn{i}_v"] = torch.zeros(shape), torch.zeros(shape)
    state[SLOTS] = torch.zeros(1, slots)
    return state


def state_shapes(model, slots: int) -> Shapes:
    """{name: shape} of the state a suffix takes after a prefix of `slots` positions."""
    return {name: tuple(t.shape) for name, t in zero_state(model, slots).items()}


def select_grid(model, length: int) -> torch.Tensor:
    """[1, K-1+L, K-1]: entry [j, t] = j - t. The new conv state takes extended position n + t, where
    n counts the real tokens, so its selection is (grid == n): built once, compared at run time."""
    k1 = (
        next(layer.linear_attn.conv_kernel_size for layer in model.layers if layer.block_type == "linear_attention") - 1
    )
    j = torch.arange(k1 + length, dtype=torch.float32)[:, None]
    t = torch.arange(k1, dtype=torch.float32)[None, :]
    return (j - t)[None]


def past_mask(past_slots: torch.Tensor, length: int) -> torch.Tensor:
    """[1, 1, L, slots]: MASKED on the empty past slots, for every query row, as the outer product of a
    ones column and the slot row (a matmul with K = 1). LiteRT's GPU accelerator refuses BROADCAST_TO,
    and the converter emits one for `expand`, and for a broadcasting add of a zero constant too."""
    return torch.ones(1, 1, length, 1) @ ((1.0 - past_slots) * MASKED)[:, None, None, :]


def prefix_slots(valid: torch.Tensor) -> torch.Tensor:
    """[1, P]: slot j holds a real token iff j < n, the count of real tokens (pads only after the last
    token, so this equals `valid`). Computed, not passed through: see the module docstring."""
    n = valid.sum(dim=-1, keepdim=True)
    index = torch.arange(valid.shape[-1], dtype=valid.dtype)[None]
    return (index < n).to(valid.dtype)


def run_layers(model, embeds, valid, cos, sin, state: dict, causal: torch.Tensor, grid: torch.Tensor):
    """The text stack over one segment, continuing from `state` -> (final-norm hidden, new state)."""
    past_slots = state[SLOTS]
    mask = causal + (1.0 - valid)[:, None, None, :] * MASKED
    if past_slots.shape[-1]:
        mask = torch.cat([past_mask(past_slots, valid.shape[-1]), mask], dim=-1)
        slots = torch.cat([past_slots, valid], dim=-1)
    else:
        slots = prefix_slots(valid)
    hidden = embeds
    new = {}
    for i, layer in enumerate(model.layers):
        hidden, produced = as_forward(layer, layer_step, i, hidden, valid, cos, sin, mask, state, grid)
        new.update(produced)
    new[SLOTS] = slots
    return model.norm(hidden), new


def layer_step(layer, i, hidden, valid, cos, sin, mask, state, grid):
    """Decoder layer `i` over one segment from `state` -> (hidden, {its state names: new state})."""
    new = {}
    residual = hidden
    x = layer.input_layernorm(hidden)
    if layer.block_type == "linear_attention":
        x, new[f"gdn{i}_conv"], new[f"gdn{i}_recurrent"] = gdn_step(
            layer.linear_attn, x, valid, state[f"gdn{i}_conv"], state[f"gdn{i}_recurrent"], grid
        )
    else:
        past_k, past_v = (state[f"attn{i}_k"], state[f"attn{i}_v"]) if state[SLOTS].shape[-1] else (None, None)
        x, new[f"attn{i}_k"], new[f"attn{i}_v"] = attention_step(layer.self_attn, x, cos, sin, mask, past_k, past_v)
    hidden = residual + x
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden)), new


def as_forward(module: nn.Module, fn, *args):
    """fn(module, *args), called as `module`'s forward (restored after): the converter then names what
    it computes after the module, `Qwen3_5DecoderLayer_<i>/` for a decoder layer, as in the row graph
    (scripts/litert/layer_cut.py finds the layers by these names)."""
    module.forward = functools.partial(fn, module)
    try:
        return module(*args)
    finally:
        del module.forward


class PairPrefix(nn.Module):
    """prefix(embeds, valid, cos, sin) -> {"hidden", **state}: P tokens from zero state."""

    def __init__(self, text_model: nn.Module, prefix: int):
        super().__init__()
        self.text_model = text_model
        self.prefix = prefix
        self.register_buffer("causal", causal_constant(prefix), persistent=False)
        self.register_buffer("grid", select_grid(text_model, prefix), persistent=False)
        for name, t in zero_state(text_model, 0).items():
            self.register_buffer("zero_" + name, t, persistent=False)

    def forward(self, embeds, valid, cos, sin):
        start = {name[5:]: buf for name, buf in self.named_buffers() if name.startswith("zero_")}
        hidden, state = run_layers(self.text_model, embeds, valid, cos, sin, start, self.causal, self.grid)
        return {"hidden": hidden, **state}


class PairSuffix(nn.Module):
    """suffix(embeds, valid, cos, sin, **state) -> {"hidden", **state'}: S tokens after P slots."""

    def __init__(self, text_model: nn.Module, prefix: int, suffix: int):
        super().__init__()
        self.text_model = text_model
        self.prefix, self.suffix = prefix, suffix
        self.register_buffer("causal", causal_constant(suffix), persistent=False)
        self.register_buffer("grid", select_grid(text_model, suffix), persistent=False)

    def forward(self, embeds, valid, cos, sin, **state):
        hidden, new = run_layers(self.text_model, embeds, valid, cos, sin, state, self.causal, self.grid)
        return {"hidden": hidden, **new}


@dataclasses.dataclass(frozen=True)
class HiddenSpec(Record):
    """The pair's `hidden` output as its contract spells it: a TensorSpec's fields with the shape last,
    the order every pair graph's metadata has always held."""

    name: str
    dtype: str
    meaning: str
    shape: list[int]


@dataclasses.dataclass(frozen=True)
class SignatureSpec(Record):
    """What one of the pair's signatures takes and gives."""

    inputs: list[TensorSpec]
    outputs: list[HiddenSpec | TensorSpec]


@dataclasses.dataclass(frozen=True)
class PairContract(Record):
    """What the pair's two signatures take and give, with the state's scale (`contract`): the model
    file's metadata holds it as `contract`, the release manifest copies it."""

    graph: str
    version: int
    P: int
    S: int
    form: str
    recurrent_state_scale: int
    signatures: dict[str, SignatureSpec]
    rule: str


def contract(model, prefix: int, suffix: int, form: str) -> PairContract:
    """What the pair's two signatures take and give, with the state's scale."""
    from scripts.layers.kernel_form import parse
    from scripts.qwen35.row_graph import CONTRACT_VERSION, rotary_width

    h, r = model.config.hidden_size, rotary_width(model.config)
    vs = parse(form).vs

    def tokens(n, start) -> list[TensorSpec]:
        return [
            TensorSpec("embeds", [1, n, h], "float32", "bf16 embed_tokens rows as fp32; pad rows 0"),
            TensorSpec("valid", [1, n], "float32", "1.0 = token, 0.0 = right pad"),
            TensorSpec("cos", [1, n, r], "float32", f"M-RoPE cos from position {start}"),
            TensorSpec("sin", [1, n, r], "float32", f"M-RoPE sin from position {start}"),
        ]

    def state(slots) -> list[TensorSpec]:
        out = []
        for name, t in zero_state(model, slots).items():
            kind = name.split("_", 1)[1]
            meaning = {
                "conv": "the last K-1 conv inputs before the first unprocessed token",
                "recurrent": f"delta-rule state after the last real token, 2^{vs} x stock (form {form})",
                "k": "keys of every slot (after k_norm and rotary)",
                "v": "values of every slot",
                "slots": "1.0 where a slot holds a real token (the same for every attention layer)",
            }[kind]
            out.append(TensorSpec(name, list(t.shape), "float32", meaning))
        return out

    def hidden(n) -> HiddenSpec:
        return HiddenSpec("hidden", "float32", "final-norm hidden states", [1, n, h])

    return PairContract(
        graph="pair",
        version=CONTRACT_VERSION,
        P=prefix,
        S=suffix,
        form=form,
        recurrent_state_scale=2**vs,
        signatures={
            "prefix": SignatureSpec(tokens(prefix, "0"), [hidden(prefix), *state(prefix)]),
            "suffix": SignatureSpec(
                tokens(suffix, "the prefix's real length") + state(prefix), [hidden(suffix), *state(prefix + suffix)]
            ),
        },
        rule="suffix(prefix(x[:p]), x[p:p+s]) equals row(x[:p+s]) at the suffix positions for p <= P, s <= S",
    )
