"""A row graph's decision figures (scripts/checks/decision.py) in every place it runs, on held-out text.

The scoring set of a row graph of length L: ceil(decision.scored_tokens / L) consecutive windows of L
tokens of the held-out text (scripts/checks/record_text.py) from its start, each position's next token
the actual one, every position real (no padding: the padded records' positions are the verify stages'
hidden-state checks). The truth: stock transformers with the checkpoint's own weights in float64 (one
layer converted at a time), the host's lm_head applied in float64. The floor: the same stock model in
torch float16 on the same windows, the decision-level counterpart of the half modes' hidden-state floor.
A place (the LiteRT CPU interpreter, a GPU mode, a weights precision) is scored on the same windows.
model.source synthetic has random weights: its decisions mean nothing, so it gets no decision figures
and its record says why (NO_DECISIONS).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from scripts.checks import decision, records
from scripts.checks.decision import DecisionBounds, DecisionFigures
from scripts.checks.record_text import HeldOutText, RecordTokens
from scripts.pipeline.errors import ClefError
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.records import Record
from scripts.qwen35.host import Host

FLOOR = "torch_float16"
"""The place name of the floor: stock transformers in torch float16."""
NO_DECISIONS = "model.source synthetic: random weights at real width, whose next-token choices mean nothing"


@dataclasses.dataclass(frozen=True)
class ScoringSet:
    """The windows a row graph of length L is scored on, and each position's actual next token."""

    length: int
    windows: list[list[int]]
    actual: torch.Tensor  # [K, L] long

    @property
    def scored_tokens(self) -> int:
        return len(self.windows) * self.length

    def records(self, host: Host) -> list[Tensors]:
        """The row graph inputs of every window (all L positions real)."""
        return [host.record(w, self.length) for w in self.windows]


def scoring_set(text: RecordTokens, length: int, scored_tokens: int) -> ScoringSet:
    """The consecutive windows of `text` from its start that score at least `scored_tokens` tokens (a pair's:
    windows of P + S, the prefix signature scoring the first P positions and the suffix the rest)."""
    if not isinstance(text, HeldOutText):
        raise ClefError(f"decision figures need text records, not {text.kind}")
    k = records.scoring_windows(length, scored_tokens)
    need = records.scoring_span(length, scored_tokens)
    if need > len(text):
        raise ClefError(
            f"the held-out text has {len(text)} tokens; {k} windows of L={length} and their next tokens need {need}"
        )
    spans = [text.window(i * length, length + 1) for i in range(k)]
    return ScoringSet(length, [s[:-1] for s in spans], torch.tensor([s[1:] for s in spans], dtype=torch.long))


@dataclasses.dataclass(frozen=True)
class DecisionTruth:
    """Stock transformers' final-norm hidden states on every window: float64 (the truth), float16 (the floor)."""

    exact: torch.Tensor  # [K, L, H] float64
    half: torch.Tensor  # [K, L, H] float16


def truth(stock, host: Host, s: ScoringSet) -> DecisionTruth:
    """`stock`: a gpu_check.StockReferences (float64 and float16 stock on real-token embeddings)."""
    exact, half = zip(*(stock.hidden(r["embeds"]) for r in s.records(host)), strict=True)
    return DecisionTruth(torch.stack(exact), torch.stack(half))


def figures(
    host: Host, s: ScoringSet, t: DecisionTruth, hidden: list[torch.Tensor], graph_host: Host | None = None
) -> DecisionFigures:
    """A place's figures: `hidden` its [L, H] (or [1, L, H]) final-norm hidden states, one per window; its
    logits through `graph_host`'s lm_head where given (a release's host tables), else the truth's."""
    if len(hidden) != len(s.windows):
        raise ClefError(f"decision figures: {len(hidden)} outputs for {len(s.windows)} windows")
    head = None if graph_host is None else graph_host.lm_head
    parts = [
        decision.scores(host.lm_head, h.reshape(s.length, -1), t.exact[k], s.actual[k], head)
        for k, h in enumerate(hidden)
    ]
    return decision.figures(decision.TokenScores.cat(parts))


def pair_hidden(runner, s: ScoringSet) -> list[torch.Tensor]:
    """A pair's hidden states on every window of P + S: the prefix's [P, H] then the suffix's [S, H] fed the
    prefix's state (`runner`: a qwen35.host.PairRunner over torch modules or LiteRT signatures)."""
    out = []
    for w in s.windows:
        prefix, state = runner.prefix(w[: runner.P])
        out.append(torch.cat([prefix[0], runner.suffix(state, w[runner.P :])[0]]))
    return out


def batched_pair_hidden(run, pair, s: ScoringSet) -> list[torch.Tensor]:
    """pair_hidden with every window's prefix in one batch, then every suffix in one: `run(signature, feeds)`
    -> one output dict per feed (a gpu_check.ModeRun); `pair` a PairRunner for its inputs and results."""
    P = pair.P
    prefixes = [pair.prefix_result(dict(o), P) for o in run("prefix", [pair.prefix_inputs(w[:P]) for w in s.windows])]
    suffixes = run("suffix", [pair.suffix_inputs(st, w[P:]) for (_, st), w in zip(prefixes, s.windows, strict=True)])
    return [torch.cat([h[0], o["hidden"][0, : pair.S]]) for (h, _), o in zip(prefixes, suffixes, strict=True)]


def floor(host: Host, s: ScoringSet, t: DecisionTruth) -> DecisionFigures:
    """The floor's figures: stock float16 against stock float64, on the same windows."""
    return figures(host, s, t, list(t.half))


@dataclasses.dataclass(frozen=True)
class DecisionRecord(Record):
    """A graph's decision figures by place (and the floor, FLOOR), on `scored_tokens` held-out tokens in
    `windows` windows of L, the graph's weights, the bounds of params.yaml `decision` and the places held to
    them (those of `decision.enforced`, when `weights` is one of `decision.held_at_weights`)."""

    L: int  # a window's length (a pair's: P + S)
    weights: str
    windows: int
    scored_tokens: int
    places: dict[str, DecisionFigures]
    bounds: dict[str, DecisionBounds]
    enforced: list[str]


def bounds_of(section: dict) -> dict[str, DecisionBounds]:
    """params.yaml `decision` -> {place: DecisionBounds}."""
    return {
        place: DecisionBounds(float(section["max_kld_mean"][place]), float(section["min_same_top"][place]))
        for place in section["max_kld_mean"]
    }


def record(s: ScoringSet, places: dict[str, DecisionFigures], section: dict, weights: str) -> DecisionRecord:
    held = weights in section["held_at_weights"]
    return DecisionRecord(
        L=s.length,
        weights=weights,
        windows=len(s.windows),
        scored_tokens=s.scored_tokens,
        places=places,
        bounds={p: b for p, b in bounds_of(section).items() if p in places},
        enforced=[p for p in section["enforced"] if p in places] if held else [],
    )


def problems(r: DecisionRecord) -> list[str]:
    """One line per bound an enforced place misses."""
    out = []
    for place in r.enforced:
        out += decision.problems(f"decision {place} L={r.L}", r.places[place], r.bounds[place])
    return out


def shown(f: DecisionFigures) -> str:
    """A place's figures in a few words, for a stage's line."""
    if math.isnan(f.kld_mean):
        return "not finite"
    return f"mean KLD {f.kld_mean:.2e}, same top {f.same_top:.2%}, ln PPL ratio {f.ln_ppl_ratio:+.1e}"


def one(records_out: list[Tensors]) -> list[torch.Tensor]:
    """Graph outputs (each a dict with `hidden` [1, L, H]) -> the hidden states."""
    return [o["hidden"][0] for o in records_out]
