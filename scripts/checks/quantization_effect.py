"""What storing the weights at a lower precision does to the answers: a graph against the unquantized
model, never mixed with its conversion error (a graph against the torch model with the same stored
weights, which the verify stages bound).

The truth is transformers' stock stack with the checkpoint's own weights in float64 (one layer
converted at a time: scripts/checks/layerwise.py). Besides the hidden states' two figures
(scripts/checks/compare.py), the decision the host makes from them: the bf16 lm_head's logits at
every real position, where the graph's top-1 token is the truth's (top1_agreement), how many of the
truth's top 5 are in the graph's top 5 (top5_agreement, a fraction), and the mean over positions of
KL(truth || graph) of the next-token distribution, in nats. Recorded, not bounded: how much a
precision may move a decision is the user's call (docs/release.md, "Weights").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scripts.checks import compare, model_check
from scripts.checks.tflite_check import RowRecords
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.records import Record
from scripts.qwen35 import patch

TOP = 5
VOCAB_BLOCK = 16384


def truths(model, records: RowRecords) -> Tensors:
    """{kind: float64 hidden [n, H]} of stock transformers on each record's real positions, with the
    weights `model` holds now (call before weight_precision.apply changes them)."""
    twin = patch.stock_twin(model)
    out = {}
    with torch.no_grad(), model_check.exact_by_layer(twin):
        for kind, (n, inputs) in records.items():
            embeds = inputs["embeds"][:, :n].double()
            out[kind] = twin(inputs_embeds=embeds, use_cache=False).last_hidden_state[0]
    return out


def logits(lm_head: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [n, H] -> float32 logits [n, V], computed in float64 a block of vocabulary rows at a time
    (clef-flash's lm_head is 2 GB in bf16: never widened whole)."""
    out = torch.empty(hidden.shape[0], lm_head.shape[0], dtype=torch.float32)
    h = hidden.double()
    for lo in range(0, lm_head.shape[0], VOCAB_BLOCK):
        out[:, lo : lo + VOCAB_BLOCK] = (h @ lm_head[lo : lo + VOCAB_BLOCK].double().T).float()
    return out


@dataclass(frozen=True)
class Decision:
    """What the graph's hidden states do to the host's choice of token, against the truth's."""

    top1_agreement: float
    top5_agreement: float
    mean_kl: float


def decision(host, hidden: torch.Tensor, truth: torch.Tensor) -> Decision:
    """Top-1 and top-5 agreement and mean KL(truth || graph) of the logits at every position (a graph
    output that is not finite agrees nowhere, at infinite KL)."""
    if not bool(torch.isfinite(hidden).all()):
        return Decision(top1_agreement=0.0, top5_agreement=0.0, mean_kl=float("inf"))
    got, want = logits(host.lm_head, hidden), logits(host.lm_head, truth)
    top1 = float((got.argmax(-1) == want.argmax(-1)).double().mean())
    got5, want5 = got.topk(TOP, dim=-1).indices, want.topk(TOP, dim=-1).indices
    top5 = float((want5[..., :, None] == got5[..., None, :]).any(-1).double().mean())
    log_p, log_q = want.double().log_softmax(-1), got.double().log_softmax(-1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    return Decision(top1_agreement=top1, top5_agreement=top5, mean_kl=kl)


@dataclass(frozen=True)
class QuantizationRow(Record):
    """One record of a graph against the unquantized truth: its kind and real tokens, the hidden
    states' two figures (scripts/checks/compare.py) and the host's Decision."""

    record: str
    n_real: int
    rel_vs_unquantized_f64: float
    rel_per_position_vs_unquantized_f64: float
    top1_agreement: float
    top5_agreement: float
    mean_kl: float


def row(kind: str, n: int, hidden: torch.Tensor, truth: torch.Tensor, host) -> QuantizationRow:
    """One record: a graph's hidden [n, H] at the real positions against the unquantized truth."""
    made = decision(host, hidden, truth)
    return QuantizationRow(
        record=kind,
        n_real=n,
        **compare.figures("vs_unquantized_f64", hidden, truth),
        top1_agreement=made.top1_agreement,
        top5_agreement=made.top5_agreement,
        mean_kl=made.mean_kl,
    )


@dataclass(frozen=True)
class QuantizationEffect(Record):
    """A graph's effect of the stored weights (results/tflite_L{L}.json `quantization_effect`, the
    weights bench's): the worst of its records (largest errors and KL, smallest agreements) and each
    record's QuantizationRow."""

    max_rel_vs_unquantized_f64: float | None
    max_rel_per_position_vs_unquantized_f64: float | None
    min_top1_agreement: float
    min_top5_agreement: float
    max_mean_kl: float | None
    rows: list[QuantizationRow]


def summary(rows: list[QuantizationRow]) -> QuantizationEffect:
    """The worst of a graph's records, with the records (NaN wins each largest: compare.largest)."""
    return QuantizationEffect(
        max_rel_vs_unquantized_f64=compare.largest(r.rel_vs_unquantized_f64 for r in rows),
        max_rel_per_position_vs_unquantized_f64=compare.largest(r.rel_per_position_vs_unquantized_f64 for r in rows),
        min_top1_agreement=min(r.top1_agreement for r in rows),
        min_top5_agreement=min(r.top5_agreement for r in rows),
        max_mean_kl=compare.largest(r.mean_kl for r in rows),
        rows=list(rows),
    )
