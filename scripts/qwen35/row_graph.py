"""The row graph: one state-free causal row of the text stack, embeddings and rotary tables in,
final-norm hidden states of every position out.

    forward(embeds f32 [1, L, H], valid f32 [1, L], cos f32 [1, L, R], sin f32 [1, L, R])
        -> {"hidden": f32 [1, L, H]}

Inside, the attention mask is `causal + (1 - valid) * -1e4` on the key axis. -1e4, not -inf: a masked
score e^(s - 1e4) is exactly 0 in fp32 and in fp16, while -1e4 plus any real score stays finite in
fp16 (limit 65504), so no delegate ever sees inf - inf. The causal part is a constant built once.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from scripts.pipeline.records import Record
from scripts.qwen35 import checkpoint_layout

# 2: a pair's state carries one attn_slots for every attention layer (was one per layer)
CONTRACT_VERSION = 2
MASKED = -1e4


def causal_constant(length: int) -> torch.Tensor:
    """[1, 1, L, L]: 0 on and below the diagonal, MASKED above."""
    i = torch.arange(length)
    return torch.where(i[None, :] <= i[:, None], 0.0, MASKED).reshape(1, 1, length, length)


class ClefRowPrefill(nn.Module):
    def __init__(self, text_model: nn.Module, length: int):
        super().__init__()
        self.text_model = text_model
        self.length = length
        self.register_buffer("causal", causal_constant(length), persistent=False)

    def forward(self, embeds, valid, cos, sin):
        mask = self.causal + (1.0 - valid)[:, None, None, :] * MASKED
        hidden = self.text_model(inputs_embeds=embeds, attention_mask=mask, valid=valid, cos=cos, sin=sin)
        return {"hidden": hidden}


@dataclasses.dataclass(frozen=True)
class TensorSpec(Record):
    """One tensor a graph's signature takes or gives, as its contract declares it."""

    name: str
    shape: list[int]
    dtype: str
    meaning: str


@dataclasses.dataclass(frozen=True)
class RowContract(Record):
    """What the row graph takes and gives (`contract`): the model file's metadata holds it as `contract`,
    the release manifest copies it."""

    graph: str
    version: int
    L: int
    form: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    attention_mask: str
    pad_guard: str
    state_io: str


def contract(config, length: int, form: str) -> RowContract:
    """What the row graph takes and gives, for the release manifest and the model file's metadata."""
    h = config.hidden_size
    r = rotary_width(config)
    return RowContract(
        graph="row",
        version=CONTRACT_VERSION,
        L=length,
        form=form,
        inputs=[
            TensorSpec(
                "embeds",
                [1, length, h],
                "float32",
                "the checkpoint's bf16 embed_tokens rows widened to float32; pad rows 0",
            ),
            TensorSpec(
                "valid",
                [1, length],
                "float32",
                "1.0 on the record's tokens, 0.0 on right pads (pads only after the last token)",
            ),
            TensorSpec("cos", [1, length, r], "float32", "M-RoPE cos table, text positions (i, i, i)"),
            TensorSpec("sin", [1, length, r], "float32", "M-RoPE sin table, text positions (i, i, i)"),
        ],
        outputs=[
            TensorSpec("hidden", [1, length, h], "float32", "last_hidden_state after the final RMSNorm, every position")
        ],
        attention_mask="causal constant (0 / -1e4) + (1 - valid) * -1e4 on the key axis",
        pad_guard="pad hidden states zeroed before the GatedDeltaNet projections, pad decay set to identity "
        "(a -> -30 before softplus), pad q/k/v zeroed after the causal conv",
        state_io="none: every record starts from zero state",
    )


def rotary_width(config) -> int:
    """The rotary tables' width for a model config (checkpoint_layout.rotary_width)."""
    return checkpoint_layout.rotary_width(config.head_dim, config.rope_parameters)
