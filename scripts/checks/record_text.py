"""Where the checks' host-built records take their tokens: windows of the corpus's held-out text.

The text is the held-out part of scripts/checkpoint/corpus.json (files the embedded checkpoint never
trained on), tokenized by the snapshot's own tokenizer (for model.source hub, clef-flash's), one
stream with the separator token between files. A record of n tokens for seed s is the window of n
tokens at an offset drawn from s; the decision figures score consecutive windows with the token
after each position as the truth to predict.
model.source synthetic keeps random token ids: its weights are random at real width, so text means
nothing to it, and its records say so (`kind`).
"""

from __future__ import annotations

import functools

import torch

from scripts.checkpoint import corpus
from scripts.pipeline.errors import ClefError
from scripts.qwen35.host import Host

HELD_OUT_TEXT = "held-out text"
RANDOM_IDS = "random ids"


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    """n token ids uniform over the vocabulary, from `seed`."""
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class RandomIds:
    """Records of random token ids (model.source synthetic)."""

    kind = RANDOM_IDS

    def __init__(self, vocab: int):
        self.vocab = vocab

    def ids(self, n: int, seed: int) -> list[int]:
        return random_ids(n, self.vocab, seed)


@functools.cache
def _stream(snapshot: str) -> tuple[int, ...]:
    """The held-out text's tokens (one tokenizing per snapshot and process: under a second on 1 MB)."""
    checked = corpus.checked()  # a missing or changed corpus file: one line, before the tokenizer loads
    tok = Host(snapshot).tokenizer  # no tokenizer: one line naming the file
    separator = tok.convert_tokens_to_ids(corpus.SEPARATOR)
    if not isinstance(separator, int) or separator == tok.unk_token_id:
        raise ClefError(f"{snapshot}: the tokenizer has no {corpus.SEPARATOR} token to separate the held-out files")
    encode = lambda t: tok(t, verbose=False)["input_ids"]  # noqa: E731 (files are longer than the context)
    return tuple(corpus.token_stream(encode, separator, corpus.text(checked, "held_out")))


class HeldOutText:
    """Records that are windows of the held-out text, tokenized by the snapshot's tokenizer."""

    kind = HELD_OUT_TEXT

    def __init__(self, host: Host):
        self.stream = _stream(str(host.snapshot))  # the corpus checked first: a changed file is one line

    def __len__(self) -> int:
        return len(self.stream)

    def window(self, offset: int, n: int) -> list[int]:
        """The n tokens from `offset` (refused past the stream's end)."""
        if not 0 <= offset <= len(self.stream) - n:
            raise ClefError(f"the held-out text has {len(self.stream)} tokens: no window of {n} at offset {offset}")
        return list(self.stream[offset : offset + n])

    def ids(self, n: int, seed: int) -> list[int]:
        if n > len(self.stream):
            raise ClefError(f"the held-out text has {len(self.stream)} tokens, a record needs {n}")
        gen = torch.Generator().manual_seed(seed)
        return self.window(int(torch.randint(0, len(self.stream) - n + 1, (1,), generator=gen)), n)


RecordTokens = HeldOutText | RandomIds


def for_source(source: str, host: Host) -> RecordTokens:
    """The record tokens of params.yaml's model.source: random ids for synthetic, held-out text otherwise."""
    if source == "synthetic":
        return RandomIds(host.embed_tokens.shape[0])
    return HeldOutText(host)
