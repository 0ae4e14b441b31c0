"""scripts/checks/decision.py: llama.cpp's KL-divergence statistics on distributions whose figures are known,
NaN never passing, and a bound that a planted fault breaks."""

from __future__ import annotations

import math

import pytest
import torch

from scripts.checks import decision
from scripts.checks.decision import DecisionBounds
from scripts.pipeline.errors import ClefError

EXACT = DecisionBounds(max_kld_mean=1e-6, min_same_top=0.999)


def scores_of(truth_logits, graph_logits, actual) -> decision.TokenScores:
    """Scores with an identity lm_head: the hidden states are the logits."""
    eye = torch.eye(truth_logits.shape[-1], dtype=torch.float64)
    return decision.scores(eye, graph_logits.double(), truth_logits.double(), torch.tensor(actual))


def test_the_same_distribution_scores_zero():
    logits = torch.randn(50, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    f = decision.figures(scores_of(logits, logits, [i % 7 for i in range(50)]))
    assert f.scored_tokens == 50 and f.kld_mean == f.kld_max == 0.0
    assert f.same_top == 1.0 and f.same_top_err == 0.0 and f.rms_delta_p == 0.0
    assert f.ln_ppl_ratio == 0.0 and f.ppl_truth == pytest.approx(f.ppl_graph)
    assert decision.problems("x", f, EXACT) == []


def test_figures_of_a_known_pair_of_distributions():
    """Truth uniform over 2 tokens, graph (0.75, 0.25) at every token, the actual token 0:
    KLD = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25), delta p = +0.25, ln PPL ratio = ln 0.5 - ln 0.75."""
    n = 10
    truth = torch.zeros(n, 2, dtype=torch.float64)
    graph = torch.log(torch.tensor([[0.75, 0.25]] * n, dtype=torch.float64))
    f = decision.figures(scores_of(truth, graph, [0] * n))
    kld = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert f.kld_mean == pytest.approx(kld) and f.kld_median == pytest.approx(kld) and f.kld_mean_err < 1e-12
    assert f.rms_delta_p == pytest.approx(0.25)
    assert f.ln_ppl_ratio == pytest.approx(math.log(0.5) - math.log(0.75))  # the graph is more sure of token 0
    assert f.ppl_truth == pytest.approx(2.0) and f.ppl_graph == pytest.approx(1 / 0.75)
    # argmax of a uniform truth is token 0 (the first), the graph's too
    assert f.same_top == 1.0


def test_percentiles_follow_llama_cpp_and_same_top_counts_argmax():
    kld = torch.arange(1001, dtype=torch.float64)  # 0 .. 1000
    s = decision.TokenScores(
        kld=kld,
        same_top=torch.arange(1001) % 4 != 0,  # 251 of 1001 differ
        delta_p=torch.zeros(1001, dtype=torch.float64),
        truth_log_p=torch.zeros(1001, dtype=torch.float64),
        graph_log_p=torch.zeros(1001, dtype=torch.float64),
    )
    f = decision.figures(s)
    assert (f.kld_p99_9, f.kld_p99, f.kld_p95, f.kld_p90) == (999.0, 990.0, 950.0, 900.0)
    assert (f.kld_p10, f.kld_p5, f.kld_p1, f.kld_median, f.kld_max) == (100.0, 50.0, 10.0, 500.0, 1000.0)
    assert f.same_top == pytest.approx(750 / 1001)
    assert f.same_top_err == pytest.approx(math.sqrt(f.same_top * (1 - f.same_top) / 1000))


def test_a_planted_fault_breaks_the_bounds():
    """A graph whose hidden states are the truth's plus noise: its mean KLD and same top miss the exact bounds."""
    gen = torch.Generator().manual_seed(2)
    truth = 3 * torch.randn(400, 20, generator=gen, dtype=torch.float64)
    noisy = truth + 0.5 * torch.randn(400, 20, generator=gen, dtype=torch.float64)
    f = decision.figures(scores_of(truth, noisy, [0] * 400))
    said = decision.problems("cpu", f, EXACT)
    assert len(said) == 2 and "mean KLD" in said[0] and "same top" in said[1], said
    assert f.kld_mean > 1e-3 and f.same_top < 0.99


@pytest.mark.parametrize("where", ["graph", "truth"])
def test_not_finite_gives_nan_figures_that_fail(where):
    logits = torch.randn(8, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    bad = logits.clone()
    bad[3, 1] = float("nan")
    s = scores_of(bad, logits, [0] * 8) if where == "truth" else scores_of(logits, bad, [0] * 8)
    f = decision.figures(s)
    assert math.isnan(f.kld_mean) and math.isnan(f.same_top)
    assert len(decision.problems("gpu_fp32", f, EXACT)) == 2


def test_shapes_that_do_not_match_are_refused():
    with pytest.raises(ClefError, match="do not match"):
        decision.scores(torch.eye(4), torch.zeros(3, 4), torch.zeros(2, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ClefError, match="no scored token"):
        decision.figures(scores_of(torch.zeros(0, 2), torch.zeros(0, 2), []))


def test_a_blocked_lm_head_gives_the_whole_product(monkeypatch):
    """The vocabulary is applied a block at a time: the same log-probabilities as one product."""
    gen = torch.Generator().manual_seed(4)
    head, hidden = torch.randn(37, 8, generator=gen), torch.randn(5, 8, generator=gen)
    whole = (hidden.double() @ head.double().T).log_softmax(-1)
    monkeypatch.setattr(decision, "VOCAB_BLOCK", 10)
    assert torch.allclose(decision.log_probs(head, hidden), whole, rtol=0, atol=1e-12)
