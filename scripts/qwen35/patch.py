"""The Qwen3.5 text stack as the row graph runs it: export-friendly classes over the same weights.

`patch(model)` turns a loaded stock `Qwen3_5TextModel` into the row graph's model in place, by
switching the classes of its instances (no weight is copied or moved):
- `ClefTextModel`: takes embeddings, a 4-D float additive mask, `valid` and the host's cos/sin, and
  runs the decoder layers; the attention layers get the mask, the GatedDeltaNets get `valid`.
- `ClefGatedDeltaNet`: the pad guard, the head interleave by concat (rank 4), the form's kernel and
  its softplus (scripts/layers/gated_delta.py set_form puts them in).
- attention: `clef_eager` (GQA by concat, rank-4 matmuls, additive mask, fp32 softmax), registered
  in transformers' attention registry and selected through the config.
- `ClefRMSNorm`: every RMSNorm but the GatedDeltaNet's gated one, its squares safe in fp16.
`stock_twin(model)` builds the reference: the same weights (shared storage) in transformers' stock
classes with sdpa attention, computing its own positions, mask and rotary tables.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

ATTENTION = "clef_eager"
# The pad guard sets a pad token's a to -30 before softplus: softplus(-30 + dt_bias) ~ 1e-13 x e^dt_bias,
# so the pad's decay e^g is 1 to fp32 precision (the state passes through), while -30 stays far from
# fp16's limits (a -inf there would turn into NaN downstream).
PAD_A = -30.0


def interleave_heads(x: torch.Tensor, r: int) -> torch.Tensor:
    """[B, L, H, D] -> [B, L, H*r, D], each head repeated r times in place (repeat_interleave's order),
    by concat on a rank-4 view: repeat_interleave would export through a rank-5 expand."""
    b, length, h, d = x.shape
    x = x.reshape(b * length, h, 1, d)
    return torch.cat([x] * r, dim=2).reshape(b, length, h * r, d)


def clef_eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention with every tensor rank <= 4: key/value [1, Hkv, L, D] are repeated by concat
    on a [Hkv, 1, L, D] view (repeat_kv's order), scores get the additive mask, softmax in fp32."""
    n_rep = module.num_key_value_groups
    b, hkv, length, d = key.shape
    if b != 1:
        raise ValueError("clef_eager attention runs batch 1 (the batch axis is folded into the head copies)")
    if n_rep > 1:
        key = torch.cat([key.reshape(hkv, 1, length, d)] * n_rep, dim=1).reshape(1, hkv * n_rep, length, d)
        value = torch.cat([value.reshape(hkv, 1, length, d)] * n_rep, dim=1).reshape(1, hkv * n_rep, length, d)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


ALL_ATTENTION_FUNCTIONS.register(ATTENTION, clef_eager_attention)


class ClefGatedDeltaNet(modeling.Qwen3_5GatedDeltaNet):
    """The GatedDeltaNet of the row graph: prefill from zero state with right pads.

    Pad guard, with valid [B, L] (1 = token, 0 = right pad): pad hidden states are zeroed before the
    projections; a pad's decay is set to identity (a -> PAD_A); pad q/k/v are zeroed again after the
    causal conv (which would otherwise leak the last real tokens into them). A zero k adds nothing to
    the state and a unit decay keeps it, so the state after the pads is the state at the last real
    token, and the real positions never see a pad.
    """

    pad_decay_guard = True  # False only inside model_change.changed(pad_guard=False): pads then decay the state
    interleave_heads = staticmethod(interleave_heads)  # a method, so model_change can count one instance's calls

    def project(self, hidden_states, valid):
        """The projections under the pad guard -> (keep [B, L, 1], pre-conv qkv [B, L, C], z, beta, a)."""
        b, length, _ = hidden_states.shape
        keep = valid.unsqueeze(-1)
        hidden_states = hidden_states * keep
        mixed_qkv = self.in_proj_qkv(hidden_states)
        z = self.in_proj_z(hidden_states).reshape(b, length, -1, self.head_v_dim)
        beta = self.in_proj_b(hidden_states).sigmoid()
        a = self.in_proj_a(hidden_states)
        if self.pad_decay_guard:
            a = a * keep + (1.0 - keep) * PAD_A
        return keep, mixed_qkv, z, beta, a

    def mix(self, conv_qkv, z, beta, a, initial_state=None, output_final_state=False):
        """Post-conv q/k/v [B, L, C] -> (layer output, final recurrent state or None): the form's
        kernel between the head interleave and the gated norm."""
        b, length = conv_qkv.shape[:2]
        query, key, value = torch.split(conv_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        query = query.reshape(b, length, -1, self.head_k_dim)
        key = key.reshape(b, length, -1, self.head_k_dim)
        value = value.reshape(b, length, -1, self.head_v_dim)

        softplus = getattr(self.chunk_gated_delta_rule, "softplus", F.softplus)  # the form's (sp), or stock
        g = -self.A_log.float().exp() * softplus(a.float() + self.dt_bias)
        r = self.num_v_heads // self.num_k_heads
        if r > 1:
            query, key = self.interleave_heads(query, r), self.interleave_heads(key, r)

        core, state = self.chunk_gated_delta_rule(
            query,
            key,
            value,
            g=g,
            beta=beta,
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=True,
        )
        core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(core.reshape(b, length, -1)), state

    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        """The row graph's GatedDeltaNet: zero state in, no state out; attention_mask is `valid`."""
        keep, mixed_qkv, z, beta, a = self.project(hidden_states, attention_mask)
        length = mixed_qkv.shape[1]
        conv = F.silu(self.conv1d(mixed_qkv.transpose(1, 2))[:, :, :length]).transpose(1, 2) * keep
        return self.mix(conv, z, beta, a)[0]


# The smallest scale ClefRMSNorm divides by: fp16's smallest normal number, so that x / scale never
# divides by zero (an all-zero pad row) and never leaves fp16's normal range.
NORM_MIN_SCALE = 2.0**-14


class ClefRMSNorm(modeling.Qwen3_5RMSNorm):
    """RMSNorm computed on x / max|x|: the same function, but its squares stay <= 1.

    A GPU delegate in fp16 squares x in fp16: a massive activation of 256 or more (trained Qwen models
    have them in the thousands) overflows to inf, rsqrt(inf) is 0, and the whole position's normed
    input becomes 0. Scaled by its largest magnitude m, x / m is in [-1, 1]; eps is carried as
    (sqrt(eps) / m)^2, so x rsqrt(mean(x^2) + eps) = (x / m) rsqrt(mean((x / m)^2) + eps / m^2) exactly."""

    def _norm(self, x):
        m = torch.clamp_min(x.abs().amax(dim=-1, keepdim=True), NORM_MIN_SCALE)
        y = x / m
        root_eps = self.eps**0.5 / m
        return y * torch.rsqrt((y * y).mean(-1, keepdim=True) + root_eps * root_eps)


class ClefTextModel(modeling.Qwen3_5TextModel):
    """The text stack with its inputs made explicit: no position ids, no mask building, no cache."""

    def forward(self, inputs_embeds, attention_mask, valid, cos, sin):
        hidden = inputs_embeds
        for layer in self.layers:
            mask = attention_mask if layer.block_type == "full_attention" else valid
            hidden = layer(hidden, position_embeddings=(cos, sin), attention_mask=mask)
        return self.norm(hidden)


def patch(model: nn.Module) -> nn.Module:
    """Switch a loaded stock text model to the row graph's classes in place; -> the same object."""
    if not isinstance(model, modeling.Qwen3_5TextModel):
        raise TypeError(f"patch expects a Qwen3_5TextModel, got {type(model).__name__}")
    model.__class__ = ClefTextModel
    for layer in model.layers:
        if layer.block_type == "linear_attention":
            layer.linear_attn.__class__ = ClefGatedDeltaNet
    for m in model.modules():
        if type(m) is modeling.Qwen3_5RMSNorm:  # not the GatedDeltaNet's Qwen3_5RMSNormGated
            m.__class__ = ClefRMSNorm
    model.config._attn_implementation = ATTENTION
    return model


def stock_twin(model: nn.Module) -> nn.Module:
    """The same weights (shared storage, no copy) in transformers' stock classes with sdpa attention."""
    from scripts.qwen35 import text_stack

    cfg = copy.deepcopy(model.config)
    cfg._attn_implementation = "sdpa"
    twin = text_stack.build_on_meta(cfg)
    twin.load_state_dict(model.state_dict(), strict=True, assign=True)
    twin.rotary_emb = modeling.Qwen3_5TextRotaryEmbedding(config=cfg)
    return twin.eval().requires_grad_(False)


def load(snapshot, form: str, progress: bool = True, block: bool = False, weights: str = "fp32"):
    """The fp32 stack of `snapshot` (block: its first block only, text_stack.first_block) patched for the
    row graph with kernel form `form` applied and its Linear weights holding what they hold once stored
    at `weights` (scripts/layers/weight_precision.py); -> (model, load facts, what the form changed).
    The facts' `weights` is the weight_precision.Applied record; what the form changed, gated_delta.FormChange."""
    from scripts.layers import gated_delta, weight_precision
    from scripts.pipeline import profile
    from scripts.qwen35 import text_stack

    with profile.part("load the stack"):
        model, info = text_stack.load_text_stack(snapshot, progress=progress, block=block)
        info = {**info, "weights": weight_precision.apply(model, weights)}  # the checkpoint's values, then the form
        patch(model)
    return model, info, gated_delta.set_form(model, form)
