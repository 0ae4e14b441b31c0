"""scripts/checks/record_text.py and decision_check's scoring set: the checks' records are windows of the
held-out text tokenized by the snapshot's own tokenizer; synthetic keeps random ids; what cannot be built is
refused in one line with the numbers."""

from __future__ import annotations

import shutil

import pytest
import torch

from scripts.checkpoint import corpus, train_tiny
from scripts.checks import decision, decision_check, gpu_check, record_text, records
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import text_stack
from scripts.qwen35.host import Host


@pytest.fixture(scope="module")
def text(tiny_snapshot) -> record_text.HeldOutText:
    return record_text.HeldOutText(Host(tiny_snapshot))


def test_the_records_are_the_held_out_text_as_the_checkpoint_was_trained_to_read_it(text):
    """The snapshot's tokenizer (through transformers) gives the stream train-tiny's tokenizer gives."""
    want = train_tiny.token_stream(corpus.text(corpus.checked(), "held_out")).tolist()
    assert list(text.stream) == want and len(text) > 100_000


def test_a_record_is_a_window_named_by_its_seed(text):
    a, b = text.ids(64, 7), text.ids(64, 8)
    assert a == text.ids(64, 7) and a != b and len(a) == 64
    start = next(i for i in range(len(text) - 63) if list(text.stream[i : i + 64]) == a)
    assert text.window(start, 64) == a


def test_what_the_text_cannot_hold_is_refused(text):
    with pytest.raises(ClefError, match=f"the held-out text has {len(text)} tokens, a record needs"):
        text.ids(len(text) + 1, 0)
    with pytest.raises(ClefError, match="no window of 10 at offset"):
        text.window(len(text) - 5, 10)


def test_synthetic_keeps_random_ids_and_says_so(tiny_snapshot):
    host = Host(tiny_snapshot)
    ids = record_text.for_source("synthetic", host)
    assert ids.kind == record_text.RANDOM_IDS and ids.ids(5, 3) == record_text.random_ids(5, 320, 3)
    assert record_text.for_source("tiny", host).kind == record_text.for_source("hub", host).kind
    with pytest.raises(ClefError, match="decision figures need text records, not random ids"):
        decision_check.scoring_set(ids, 64, 128)


def test_a_snapshot_without_a_tokenizer_is_refused_naming_the_file(tiny_snapshot, tmp_path):
    bare = tmp_path / "snap"
    shutil.copytree(tiny_snapshot, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(ClefError, match=r"snap/tokenizer.json is missing: the snapshot's tokenizer") as e:
        record_text.HeldOutText(Host(bare))
    assert "\n" not in str(e.value)


def test_the_scoring_set_is_consecutive_windows_with_their_next_tokens(text):
    s = decision_check.scoring_set(text, 64, 200)
    assert len(s.windows) == records.scoring_windows(64, 200) == 4 and s.scored_tokens == 256
    flat = [t for w in s.windows for t in w]
    assert flat == list(text.stream[:256]) and s.actual.flatten().tolist() == list(text.stream[1:257])
    with pytest.raises(ClefError, match=f"the held-out text has {len(text)} tokens; .* need"):
        decision_check.scoring_set(text, 256, len(text))


def test_the_truth_scores_itself_exactly_and_the_floor_does_not(tiny_snapshot, text):
    """On the tiny checkpoint: float64 against itself is KLD 0 and every top the same; torch float16 is not
    exact but close (the floor)."""
    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    host = Host(tiny_snapshot)
    s = decision_check.scoring_set(text, 64, 128)
    truth = decision_check.truth(gpu_check.StockReferences(model), host, s)
    exact = decision_check.figures(host, s, truth, list(truth.exact))
    assert exact.kld_max == 0.0 and exact.same_top == 1.0 and exact.scored_tokens == 128
    floor = decision_check.floor(host, s, truth)
    assert 0 < floor.kld_mean < 1e-2 and floor.same_top > 0.9
    wrong = decision_check.figures(host, s, truth, [torch.roll(h, 1, 0) for h in truth.exact])  # off by a position
    assert wrong.kld_mean > 100 * floor.kld_mean


def test_the_params_check_refuses_a_held_out_text_too_short_with_the_numbers():
    pairs = [{"prefix": 256, "suffix": 64}]
    assert records.text_unfit([64, 256], pairs, (8192, 2048), 997_462) is None
    said = records.text_unfit([64, 256], pairs, (8192, 2048), 5_000)
    assert said == (
        "the held-out text holds 5,000 bytes, so at most as many tokens, and the decision windows of L=64 "
        "need 8,193 (decision.scored_tokens 8,192, pair_scored_tokens 2,048)"
    )
    assert "P=256 S=64 need 321" in records.text_unfit([64], pairs, (1, 1), 300)


def test_the_places_are_held_only_at_the_weights_params_name():
    """decision.enforced holds its places when the graphs' weights are in decision.held_at_weights; an int8
    graph's places are recorded against the same bounds, not held (the storage is the user's choice)."""
    import yaml

    from tests.conftest import ROOT

    section = yaml.safe_load((ROOT / "params.yaml").read_text())["decision"]
    s = decision_check.ScoringSet(4, [[1, 2, 3, 4]], torch.tensor([[2, 3, 4, 5]]))
    truth = torch.zeros(4, 3, dtype=torch.float64)
    f = decision.figures(decision.scores(torch.eye(3), truth, truth, torch.tensor([0, 1, 2, 0])))
    places = {"cpu": f, "gpu_fp16": f}
    assert decision_check.record(s, places, section, "fp16").enforced == ["cpu"]
    made = decision_check.record(s, places, section, "int8")
    assert made.enforced == [] and set(made.bounds) == {"cpu", "gpu_fp16"} and made.weights == "int8"
