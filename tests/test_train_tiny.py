"""The trained embedded checkpoint: the training is deterministic and names a differing tensor; the committed
tensors are the ones it trains; the trained model keeps what verification needs (memory across a chunk,
massive activations) and predicts held-out text better than a bigram."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scripts.checkpoint import corpus, tiny_checkpoint, tiny_quality, train_tiny
from scripts.pipeline.errors import ClefError
from tests.test_tiny_checkpoint import (
    KEPT,
    MASSIVE_OVER_REST_DRAWN,
    chunk_survival,
    heads_keeping_memory,
    massive_ratios,
)

RESULTS = Path(__file__).resolve().parent.parent / "results"


@pytest.fixture
def small_corpus(monkeypatch):
    """Two short files for the train part, so a training of a few steps takes seconds."""
    texts = ["def f(x):\n    return x + 1\n" * 80, "class A:\n    pass\n" * 80]
    monkeypatch.setattr(corpus, "text", lambda c, part, root=None: texts)


def test_two_trainings_give_the_same_bytes_and_a_change_is_named(small_corpus):
    a, rec = train_tiny.train(steps=2, progress=False)
    b, _ = train_tiny.train(steps=2, progress=False)
    assert train_tiny.differing(a, b) == []
    assert rec.tokens == 2 * train_tiny.BATCH * train_tiny.WINDOW and len(rec.loss) == 2
    key = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    b[key] = b[key].clone()
    b[key][0, 0] += 1.0
    assert train_tiny.differing(a, b) == [key]
    del b["lm_head.weight"]
    assert train_tiny.differing(a, b) == ["lm_head.weight", key]  # sorted


def test_the_decay_parameters_are_not_trained():
    stack, head = train_tiny.drawn_model()
    keys = train_tiny.trained_keys(stack, head)
    assert "lm_head.weight" in keys and "model.language_model.embed_tokens.weight" in keys
    assert not [k for k in keys if k.endswith(train_tiny.FROZEN)]
    assert any(k.endswith(".A_log") for k, _ in stack.named_parameters())


def test_the_committed_tensors_are_the_trained_ones_and_moved():
    """Every trained key is stored in bf16, and training moved it away from the draw."""
    from safetensors.torch import load_file

    stored = load_file(str(train_tiny.TENSORS))
    stack, head = train_tiny.drawn_model()
    assert set(stored) == set(train_tiny.trained_keys(stack, head))
    drawn = tiny_checkpoint.drawn_tensors()
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    assert all(not torch.equal(stored[k], drawn[k]) for k in stored)
    record = train_tiny.TrainingRecord.read(train_tiny.RECORD)
    assert record.steps == train_tiny.STEPS and len(record.loss) == record.steps
    assert record.loss[-1] < 0.5 * record.loss[0]


def test_a_stored_file_with_other_keys_is_refused(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    save_file({"lm_head.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}, str(tmp_path / "t.safetensors"))
    monkeypatch.setattr(train_tiny, "TENSORS", tmp_path / "t.safetensors")
    with pytest.raises(ClefError, match="is not both trained and stored"):
        train_tiny.trained_model()


def held_out_ids(n: int = 200) -> torch.Tensor:
    c = corpus.checked()
    return train_tiny.token_stream(corpus.text(c, "held_out")[:1])[:n][None]


def test_the_trained_gated_deltanets_keep_memory_across_a_chunk():
    """Measured on held-out text: at least half the heads of every GatedDeltaNet keep >= 10 % of their
    state over 64 tokens (the property verification's chunk-carry controls need)."""
    stack, _ = train_tiny.trained_model()
    with torch.no_grad():
        embeds = stack.embed_tokens(held_out_ids())
    shares = heads_keeping_memory(chunk_survival(stack, embeds))
    assert min(shares.values()) >= 0.5, shares
    assert KEPT == 0.1


def test_the_draw_holds_massive_activations_at_50x():
    """Where training starts: at massive-activation tokens of held-out text the chosen channels are >= 50x the
    median of the others entering every layer (the trained checkpoint's own bound: tests/test_tiny_checkpoint.py)."""
    stack, _ = train_tiny.drawn_model()
    ids = held_out_ids()
    with torch.no_grad():
        states = stack(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
    medians, _, _ = massive_ratios(states, ids[0].tolist(), stack.config)
    assert min(medians) >= MASSIVE_OVER_REST_DRAWN, medians


def test_the_recorded_quality_beats_the_bigram_and_the_draw():
    doc = json.loads((RESULTS / "tiny_quality.json").read_text())
    r = tiny_quality.QualityReport.from_json(doc, "tiny_quality.json")
    assert r.to_json() == doc
    assert r.scored_tokens >= 8192
    assert r.trained.bits_per_byte < r.bigram.bits_per_byte < r.drawn.bits_per_byte
    assert r.trained.top1_accuracy > r.bigram.top1_accuracy


def test_quality_figures_of_a_known_distribution():
    """Uniform over 4 tokens, each spelling 2 bytes: 1 bit per byte, top-1 probability 0.25."""
    lp = torch.full((6, 4), -torch.log(torch.tensor(4.0, dtype=torch.float64)))
    q = tiny_quality.quality(lp, torch.tensor([0, 1, 2, 3, 0, 1]), nbytes=12)
    assert q.bits_per_byte == pytest.approx(1.0) and q.mean_top1_probability == pytest.approx(0.25)
    assert q.top1_accuracy == pytest.approx(2 / 6, abs=1e-5)  # argmax picks token 0
