"""scripts/checks/quantization_effect.py: its row and summary as typed records whose JSON keeps the keys,
in the order, the dicts had (results/tflite_L{L}.json `quantization_effect`, the weights bench's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from scripts.checks import quantization_effect
from scripts.checks.quantization_effect import QuantizationEffect
from scripts.pipeline.errors import ClefError

ROW_KEYS = [
    "record",
    "n_real",
    "rel_vs_unquantized_f64",
    "rel_per_position_vs_unquantized_f64",
    "top1_agreement",
    "top5_agreement",
    "mean_kl",
]
SUMMARY_KEYS = [
    "max_rel_vs_unquantized_f64",
    "max_rel_per_position_vs_unquantized_f64",
    "min_top1_agreement",
    "min_top5_agreement",
    "max_mean_kl",
    "rows",
]


def rows():
    torch.manual_seed(0)
    host = SimpleNamespace(lm_head=torch.randn(40, 8, dtype=torch.bfloat16))
    truth = torch.randn(6, 8, dtype=torch.float64)
    near = quantization_effect.row("full", 6, truth.float() + 1e-3, truth, host)
    broken = quantization_effect.row("padded", 6, torch.full((6, 8), float("nan")), truth, host)
    return near, broken


def test_the_rows_and_summary_keep_their_keys_and_worst_figures():
    near, broken = rows()
    assert list(near.to_json()) == ROW_KEYS and near.top1_agreement == 1.0
    assert (broken.top1_agreement, broken.mean_kl) == (0.0, float("inf"))
    doc = quantization_effect.summary([near, broken]).to_json()
    assert list(doc) == SUMMARY_KEYS and [list(r) for r in doc["rows"]] == [ROW_KEYS, ROW_KEYS]
    assert doc["min_top1_agreement"] == 0.0 and doc["max_mean_kl"] == float("inf")
    assert doc["max_rel_vs_unquantized_f64"] == float("inf")  # the NaN output's figure wins the largest
    assert QuantizationEffect.from_json(doc, "effect") == quantization_effect.summary([near, broken])


def test_a_summary_without_a_field_is_refused_naming_it():
    doc = quantization_effect.summary(list(rows())).to_json()
    del doc["rows"][1]["mean_kl"]
    with pytest.raises(ClefError, match="mean_kl"):
        QuantizationEffect.from_json(doc, "effect")
