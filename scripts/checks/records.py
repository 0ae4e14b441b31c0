"""How many real tokens each host-built record of the checks holds, for a row graph of length L and a
pair of prefix P and suffix S. Torch-free: params.yaml's schema (scripts/pipeline/params.py) holds
`lengths` and `pairs` to the records the checks will build, so a length no check can take is refused
before any stage runs, not by verify_model after it removed its outputs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RowTokens:
    """How many real tokens each row record holds, by kind (a field's name is the record's kind)."""

    full: int
    padded: int
    one_token: int

    def items(self) -> list[tuple[str, int]]:
        """(kind, real tokens) of every row record, in this order."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]


ROW_KINDS = tuple(f.name for f in dataclasses.fields(RowTokens))
"""The row records' kinds, in the order the checks build them."""


def row_tokens(length: int) -> RowTokens:
    """The row records of verify_model and verify_tflite: all L tokens, a right-padded record, and a
    single token (the most padding)."""
    return RowTokens(full=length, padded=length - length // 3, one_token=1)


def causality_tokens(length: int) -> int:
    """verify_model's causality record: past half of L by a few tokens, a multiple of no chunk."""
    return length // 2 + 3


def chaining_lengths(P: int, S: int) -> tuple[list[int], list[int]]:
    """The prefix lengths p and suffix lengths s a chaining check covers: 1, P/2 and P real prefix
    tokens (the most padding, half, none), 1 and S real suffix tokens."""
    return sorted({1, P // 2, P}), sorted({1, S})


def shared_length(P: int) -> int:
    """The prefix length the state and reuse checks (and the release's reference record) share with
    chaining: P/2, half padded."""
    return P // 2


def scoring_windows(length: int, scored_tokens: int) -> int:
    """How many windows of L tokens the decision figures of a row graph score (scripts/checks/decision_check.py):
    enough for `scored_tokens`."""
    return -(-scored_tokens // length)


def scoring_span(length: int, scored_tokens: int) -> int:
    """The held-out tokens those windows read: consecutive windows, and the token after the last."""
    return scoring_windows(length, scored_tokens) * length + 1


def text_unfit(lengths: list[int], pairs: list[dict], scored: tuple[int, int], held_out_bytes: int) -> str | None:
    """Why a held-out text of `held_out_bytes` bytes cannot hold the tokens the records need, or None. A token
    spans at least one byte, so the bytes bound the tokens from above: what passes here can still be refused
    (with the tokens counted) where the records are built, what fails here can never fit. `scored`: params.yaml
    decision.scored_tokens (rows) and decision.pair_scored_tokens (pairs)."""
    scored_tokens, pair_tokens = scored
    needs = [(f"the decision windows of L={n}", scoring_span(n, scored_tokens)) for n in lengths]
    needs += [
        (
            f"the decision windows of the pair P={q['prefix']} S={q['suffix']}",
            scoring_span(q["prefix"] + q["suffix"], pair_tokens),
        )
        for q in pairs
    ]
    what, need = max(needs, key=lambda x: x[1])
    if need > held_out_bytes:
        return (
            f"the held-out text holds {held_out_bytes:,} bytes, so at most as many tokens, and {what} "
            f"need {need:,} (decision.scored_tokens {scored_tokens:,}, pair_scored_tokens {pair_tokens:,})"
        )
    return None


def row_unfit(length: int) -> str | None:
    """Why the checks cannot build their records for a row graph of `length`, or None."""
    need = [(f"the {k} record", n, length) for k, n in row_tokens(length).items()]
    need.append(("the causality record (L//2 + 3)", causality_tokens(length), length))
    return _unfit(need)


def pair_unfit(P: int, S: int) -> str | None:
    """Why the checks cannot build their records for a pair of prefix P and suffix S, or None."""
    prefixes, suffixes = chaining_lengths(P, S)
    need = [("a chaining prefix (1, P//2, P)", p, P) for p in prefixes]
    need.append(("the shared prefix (P//2)", shared_length(P), P))
    need += [("a chaining suffix (1, S)", s, S) for s in suffixes]
    return _unfit(need)


def _unfit(need: list[tuple[str, int, int]]) -> str | None:
    """The first (what, tokens, room) whose tokens are not 1..room, in words, or None."""
    for what, n, room in need:
        if not 1 <= n <= room:
            return f"{what} holds {n} tokens, outside 1..{room}"
    return None
