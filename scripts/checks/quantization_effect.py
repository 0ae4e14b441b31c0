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

import torch

from scripts.checks import compare, model_check
from scripts.checks.tflite_check import RowRecords
from scripts.pipeline.mappings import Tensors
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


def decision(host, hidden: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """Top-1 and top-5 agreement and mean KL(truth || graph) of the logits at every position (a graph
    output that is not finite agrees nowhere, at infinite KL)."""
    if not bool(torch.isfinite(hidden).all()):
        return {"top1_agreement": 0.0, "top5_agreement": 0.0, "mean_kl": float("inf")}
    got, want = logits(host.lm_head, hidden), logits(host.lm_head, truth)
    top1 = float((got.argmax(-1) == want.argmax(-1)).double().mean())
    got5, want5 = got.topk(TOP, dim=-1).indices, want.topk(TOP, dim=-1).indices
    top5 = float((want5[..., :, None] == got5[..., None, :]).any(-1).double().mean())
    log_p, log_q = want.double().log_softmax(-1), got.double().log_softmax(-1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    return {"top1_agreement": top1, "top5_agreement": top5, "mean_kl": kl}


def row(kind: str, n: int, hidden: torch.Tensor, truth: torch.Tensor, host) -> dict[str, str | int | float]:
    """One record: a graph's hidden [n, H] at the real positions against the unquantized truth."""
    return {
        "record": kind,
        "n_real": n,
        **compare.figures("vs_unquantized_f64", hidden, truth),
        **decision(host, hidden, truth),
    }


def summary(rows: list[dict]) -> dict[str, float | None]:
    """The worst of a graph's records: largest errors and KL, smallest agreements."""
    return {
        "max_rel_vs_unquantized_f64": compare.worst(rows, "rel_vs_unquantized_f64"),
        "max_rel_per_position_vs_unquantized_f64": compare.worst(rows, "rel_per_position_vs_unquantized_f64"),
        "min_top1_agreement": min(r["top1_agreement"] for r in rows),
        "min_top5_agreement": min(r["top5_agreement"] for r in rows),
        "max_mean_kl": compare.worst(rows, "mean_kl"),
    }
