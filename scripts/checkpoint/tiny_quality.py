"""How well the trained embedded checkpoint predicts the held-out text, beside a bigram and the drawn model.

Figures (results/tiny_quality.json, make train-tiny): cross-entropy in bits per byte (nats of every
scored token over the UTF-8 bytes those tokens spell), the model's own top-1 accuracy and mean top-1
probability, over non-overlapping windows of the held-out stream (each window's first token is context
only). The bigram is fitted on the train part's tokens with additive smoothing BIGRAM_K; the drawn
(untrained) checkpoint is measured the same way, so the training's effect is one ratio.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from scripts.checkpoint import corpus, train_tiny
from scripts.pipeline.records import Record

RESULT = "results/tiny_quality.json"
WINDOWS = 48
BIGRAM_K = 0.1


@dataclasses.dataclass(frozen=True)
class Quality(Record):
    bits_per_byte: float
    top1_accuracy: float
    mean_top1_probability: float


@dataclasses.dataclass(frozen=True)
class QualityReport(Record):
    scored_tokens: int
    scored_bytes: int
    window: int
    trained: Quality
    drawn: Quality
    bigram: Quality
    bigram_k: float


def token_bytes() -> torch.Tensor:
    """[vocab] the number of UTF-8 bytes each token id spells (special tokens: 0)."""
    from scripts.checkpoint import tiny_checkpoint

    tok = train_tiny.tokenizer()
    alphabet = {ch: 1 for ch in tiny_checkpoint.byte_alphabet()}
    out = torch.zeros(tiny_checkpoint.TEXT_CONFIG["vocab_size"], dtype=torch.long)
    for piece, i in tok.get_vocab(with_added_tokens=False).items():
        out[i] = sum(alphabet.get(ch, 0) for ch in piece)
    return out


def quality(log_probs: torch.Tensor, targets: torch.Tensor, nbytes: int) -> Quality:
    """Figures of next-token log-probabilities `log_probs` [N, V] for `targets` [N]."""
    nats = -log_probs.gather(1, targets[:, None]).sum()
    top = log_probs.argmax(1)
    return Quality(
        bits_per_byte=round(float(nats) / math.log(2) / nbytes, 5),
        top1_accuracy=round(float((top == targets).double().mean()), 5),
        mean_top1_probability=round(float(log_probs.max(1).values.exp().double().mean()), 5),
    )


def model_log_probs(stack, head, windows: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = stack(input_ids=windows[:, :-1], use_cache=False).last_hidden_state
        return torch.log_softmax(head(hidden).double(), -1).flatten(0, 1)


def bigram_log_probs(train: torch.Tensor, previous: torch.Tensor, vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    counts.index_put_((train[:-1], train[1:]), torch.ones(len(train) - 1, dtype=torch.float64), accumulate=True)
    table = (counts + BIGRAM_K).log() - (counts.sum(1, keepdim=True) + BIGRAM_K * vocab).log()
    return table[previous]


def report() -> QualityReport:
    torch.set_num_threads(train_tiny.THREADS)
    c = corpus.checked()
    held = train_tiny.token_stream(corpus.text(c, "held_out"))
    window = train_tiny.WINDOW
    n = min(WINDOWS, (len(held) - 1) // (window + 1))
    windows = held[: n * (window + 1)].view(n, window + 1)
    targets = windows[:, 1:].flatten()
    nbytes = int(token_bytes()[targets].sum())
    stack, head = train_tiny.drawn_model()
    drawn = quality(model_log_probs(stack, head, windows), targets, nbytes)
    stack, head = train_tiny.trained_model()
    vocab = head.weight.shape[0]
    train_stream = train_tiny.token_stream(corpus.text(c, "train"))
    return QualityReport(
        scored_tokens=len(targets),
        scored_bytes=nbytes,
        window=window,
        trained=quality(model_log_probs(stack, head, windows), targets, nbytes),
        drawn=drawn,
        bigram=quality(bigram_log_probs(train_stream, windows[:, :-1].flatten(), vocab), targets, nbytes),
        bigram_k=BIGRAM_K,
    )


if __name__ == "__main__":
    from scripts.pipeline import atomic
    from scripts.pipeline.errors import run_command

    def main() -> None:
        r = report()
        atomic.write_json(RESULT, r.to_json())
        print(
            f"tiny quality on {r.scored_tokens:,} held-out tokens: trained {r.trained.bits_per_byte:.3f} bits/byte "
            f"(top-1 {r.trained.top1_accuracy:.3f}), bigram {r.bigram.bits_per_byte:.3f}, "
            f"drawn {r.drawn.bits_per_byte:.3f}"
        )

    run_command(main)
