"""What the host decides from a graph's hidden states, judged the way the field judges a quantized or
lower-precision model: llama.cpp's `llama-perplexity --kl-divergence` statistics.

Per scored token t (the hidden state at a position, the held-out text's next token as the actual one),
with p the truth's next-token distribution and q the graph's, both from the host's lm_head in float64:
- KLD_t = sum_v p_v (ln p_v - ln q_v), nats;
- same top: argmax q == argmax p;
- delta p: q(actual) - p(actual);
- ln PPL ratio: the mean over t of ln p(actual) - ln q(actual), i.e. ln(PPL(graph) / PPL(truth)).
Reported: KLD mean (with its standard error), median, the percentiles llama.cpp prints (99.9, 99, 95, 90,
10, 5, 1), max; RMS delta p and same-top share, each with its standard error; the ln PPL ratio with the
standard error of the per-token difference; both perplexities. Nothing not finite passes: a graph output
or a truth with NaN or inf gives figures of NaN, which every bound (`not value <= limit`) fails.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record

VOCAB_BLOCK = 16384
PERCENTILES = (99.9, 99.0, 95.0, 90.0, 10.0, 5.0, 1.0)


def log_probs(lm_head: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [n, H] -> float64 log-softmax of the logits [n, V], lm_head [V, H] applied in float64 a
    block of vocabulary rows at a time (clef-flash's lm_head is 2 GB in bf16: never widened whole)."""
    h = hidden.double()
    logits = torch.cat(
        [h @ lm_head[lo : lo + VOCAB_BLOCK].double().T for lo in range(0, lm_head.shape[0], VOCAB_BLOCK)], dim=-1
    )
    return logits.log_softmax(-1)


@dataclasses.dataclass(frozen=True)
class TokenScores:
    """Per scored token: KLD(truth || graph), whether the top token is the same, delta p of the actual
    next token, and both log-probabilities of it."""

    kld: torch.Tensor  # [n] float64
    same_top: torch.Tensor  # [n] bool
    delta_p: torch.Tensor  # [n] float64
    truth_log_p: torch.Tensor  # [n] float64
    graph_log_p: torch.Tensor  # [n] float64

    @staticmethod
    def cat(parts: list[TokenScores]) -> TokenScores:
        return TokenScores(*(torch.cat([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(TokenScores)))


def scores(
    lm_head: torch.Tensor, hidden: torch.Tensor, truth: torch.Tensor, actual: torch.Tensor, graph_lm_head=None
) -> TokenScores:
    """The TokenScores of a graph's hidden [n, H] against the truth's [n, H], actual next tokens [n];
    `graph_lm_head`: the graph's logits through another lm_head (a release's quantized host table)."""
    if hidden.shape != truth.shape or actual.shape != (hidden.shape[0],):
        raise ClefError(
            f"decision scores: hidden {list(hidden.shape)}, truth {list(truth.shape)} and "
            f"{list(actual.shape)} next tokens do not match"
        )
    log_p, log_q = log_probs(lm_head, truth), log_probs(lm_head if graph_lm_head is None else graph_lm_head, hidden)
    kld = (log_p.exp() * (log_p - log_q)).sum(-1)
    pick = actual.long()[:, None]
    truth_lp, graph_lp = log_p.gather(-1, pick)[:, 0], log_q.gather(-1, pick)[:, 0]
    return TokenScores(
        kld=kld,
        same_top=log_q.argmax(-1) == log_p.argmax(-1),
        delta_p=graph_lp.exp() - truth_lp.exp(),
        truth_log_p=truth_lp,
        graph_log_p=graph_lp,
    )


@dataclasses.dataclass(frozen=True)
class DecisionFigures(Record):
    """llama.cpp's KL-divergence statistics over `scored_tokens` tokens (each `_err`: one standard error)."""

    scored_tokens: int
    kld_mean: float
    kld_mean_err: float
    kld_median: float
    kld_p99_9: float
    kld_p99: float
    kld_p95: float
    kld_p90: float
    kld_p10: float
    kld_p5: float
    kld_p1: float
    kld_max: float
    same_top: float
    same_top_err: float
    rms_delta_p: float
    rms_delta_p_err: float
    ln_ppl_ratio: float
    ln_ppl_ratio_err: float
    ppl_truth: float
    ppl_graph: float


def _percentile(sorted_values: torch.Tensor, pct: float) -> float:
    """llama.cpp's rule: the value at index round((n - 1) x pct / 100) of the sorted values."""
    return float(sorted_values[round((len(sorted_values) - 1) * pct / 100)])


def _err(values: torch.Tensor) -> float:
    """The standard error of the mean of `values` (0 for a single value)."""
    n = len(values)
    return float(values.std(correction=1) / math.sqrt(n)) if n > 1 else 0.0


def figures(s: TokenScores) -> DecisionFigures:
    """The statistics of the scored tokens `s`; every figure NaN if any score is not finite."""
    n = len(s.kld)
    if n == 0:
        raise ClefError("decision figures of no scored token")
    finite = all(bool(torch.isfinite(t).all()) for t in (s.kld, s.delta_p, s.truth_log_p, s.graph_log_p))
    if not finite:
        nan = float("nan")
        return DecisionFigures(n, *[nan] * (len(dataclasses.fields(DecisionFigures)) - 1))
    kld = s.kld.clamp_min(0.0)  # rounding can leave -1e-17 where the two agree
    ordered = kld.sort().values
    pct = {p: _percentile(ordered, p) for p in PERCENTILES}
    same = float(s.same_top.double().mean())
    dp2 = s.delta_p.square()
    rms = math.sqrt(float(dp2.mean()))
    diff = s.truth_log_p - s.graph_log_p
    return DecisionFigures(
        scored_tokens=n,
        kld_mean=float(kld.mean()),
        kld_mean_err=_err(kld),
        kld_median=_percentile(ordered, 50.0),
        kld_p99_9=pct[99.9],
        kld_p99=pct[99.0],
        kld_p95=pct[95.0],
        kld_p90=pct[90.0],
        kld_p10=pct[10.0],
        kld_p5=pct[5.0],
        kld_p1=pct[1.0],
        kld_max=float(ordered[-1]),
        same_top=same,
        same_top_err=math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0,
        rms_delta_p=rms,
        rms_delta_p_err=_err(dp2) / (2 * rms) if rms > 0 else 0.0,
        ln_ppl_ratio=float(diff.mean()),
        ln_ppl_ratio_err=_err(diff),
        ppl_truth=math.exp(float(-s.truth_log_p.mean())),
        ppl_graph=math.exp(float(-s.graph_log_p.mean())),
    )


@dataclasses.dataclass(frozen=True)
class DecisionBounds(Record):
    """params.yaml's bounds on a place's decision figures: the mean KLD at most, the same-top share at least."""

    max_kld_mean: float
    min_same_top: float


def problems(place: str, f: DecisionFigures, bounds: DecisionBounds) -> list[str]:
    """One line per bound the figures miss (NaN misses both)."""
    out = []
    if not f.kld_mean <= bounds.max_kld_mean:
        out.append(f"{place}: mean KLD {f.kld_mean:.3g} over {f.scored_tokens} tokens > {bounds.max_kld_mean:g}")
    if not f.same_top >= bounds.min_same_top:
        out.append(f"{place}: same top {f.same_top:.4%} over {f.scored_tokens} tokens < {bounds.min_same_top:.2%}")
    return out
