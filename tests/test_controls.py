"""The faults the checks rerun with (scripts/checks/controls.py): each breaks its check on the embedded
checkpoint, the control itself fails on weights without memory, and every patch is restored."""

from __future__ import annotations

import copy

import pytest
import torch

from scripts.checks import compare, controls, model_check, record_text
from scripts.layers import gated_delta
from scripts.qwen35 import model_change, patch, text_stack
from scripts.qwen35.host import Host
from scripts.qwen35.patch import ClefGatedDeltaNet

FORM = "R64+sp+ec+dd+vs6"
LAYER_BOUND = 1e-5  # params.yaml verify_layers.max_rel_vs_stock_f64


@pytest.fixture(scope="module")
def stock(tiny_snapshot):
    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    return model


def layer_control(model) -> float:
    rows = model_check.layer_rows(copy.deepcopy(model), FORM, seeds=(5,), scales=(1.0,))
    assert max(r["rel_vs_stock_f64"] for r in rows) < LAYER_BOUND
    return min(r["control_memory_cut_rel_vs_stock_f64"] for r in rows)


def test_memory_cut_breaks_the_layer_check_on_every_layer(stock):
    """The state carried between chunks matters in every GatedDeltaNet of the embedded checkpoint."""
    weakest = layer_control(stock)
    assert compare.control_problems("memory_cut", weakest, LAYER_BOUND, 100) == [], weakest


def test_memory_cut_control_fails_on_weights_without_memory(stock):
    """Decays x e^8 (every head forgets within a few tokens): the fault no longer shows, and the
    control says the check cannot see it."""
    forgetful = copy.deepcopy(stock)
    with torch.no_grad():
        for m in gated_delta.gated_deltanets(forgetful):
            m.A_log += 8.0
    weakest = layer_control(forgetful)
    lines = compare.control_problems("memory_cut", weakest, LAYER_BOUND, 100)
    assert len(lines) == 1 and "cannot see the failure it is named after" in lines[0], (weakest, lines)


def test_memory_cut_does_not_exist_within_one_chunk():
    assert controls.memory_cut_applies(FORM, 65) and not controls.memory_cut_applies(FORM, 64)
    assert compare.control_problems("memory_cut", None, 1e-5, 100) == []  # recorded as not applying


def test_faults_are_restored_even_on_error(tiny_snapshot):
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    layers = gated_delta.gated_deltanets(model)
    kernels = [m.chunk_gated_delta_rule for m in layers]
    with pytest.raises(RuntimeError):
        with model_change.changed(model, memory_cut=True, pad_guard=False):
            assert not any(m.pad_decay_guard for m in layers) and ClefGatedDeltaNet.pad_decay_guard
            assert all("zeroed" in m.chunk_gated_delta_rule.__name__ for m in layers)
            raise RuntimeError("midway")
    assert all(m.pad_decay_guard for m in layers) and all("pad_decay_guard" not in vars(m) for m in layers)
    assert [m.chunk_gated_delta_rule for m in layers] == kernels


def test_causality_cannot_see_the_pad_guard(tiny_snapshot):
    """Row-level garbage-vs-zero pads stay exact with the guard removed: what guards the pads is
    verify_pair's chaining with padded prefixes (tests/test_pair_graph.py shows it failing)."""
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    with model_change.changed(model, pad_guard=False):
        row = model_check.causality(
            model, Host(tiny_snapshot), 64, record_text.RandomIds(model.config.vocab_size), seed=0
        )
    assert row.rel_causality == 0.0
    assert list(row.to_json()) == [  # results/model.json's causality row, as it has always been written
        "check",
        "L",
        "n_real",
        "rel_causality",
        "rel_garbage_vs_zero_pads",
        "rel_f64_no_pads_vs_zero_pads",
        "fp32_rel_no_pads_vs_zero_pads",
        "finite",
    ]


def test_zero_recurrent_keeps_everything_but_the_recurrent_state():
    state = {"gdn0_recurrent": torch.ones(1, 2, 3, 3), "gdn0_conv": torch.ones(1, 4, 3), "attn_slots": torch.ones(1, 5)}
    out = controls.zero_recurrent(state)
    assert not out["gdn0_recurrent"].any() and out["gdn0_conv"].all() and out["attn_slots"].all()
