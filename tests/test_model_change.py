"""scripts/qwen35/model_change.py: every change applies inside the block and is undone after it, an
error midway included, and a change that would find nothing to change is refused."""

from __future__ import annotations

import pytest
import torch

from scripts.layers import gated_delta, kernel_form
from scripts.layers.split_linear import SplitLinear
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import model_change, patch, text_stack
from scripts.qwen35.patch import ClefGatedDeltaNet

FORM = "R64+sp+ec+dd+vs6"


@pytest.fixture(scope="module")
def stock(tiny_snapshot):
    return text_stack.load_text_stack(tiny_snapshot, progress=False)[0]


def state_of(model) -> list:
    """Everything a change may touch: classes, kernels, norm eps, per-instance attributes, attention."""
    return (
        [
            (
                type(m),
                m.__dict__.get("chunk_gated_delta_rule"),
                getattr(getattr(m, "norm", None), "variance_epsilon", None),
            )
            for m in model.modules()
        ]
        + [sorted(vars(m)) for m in model.modules()]
        + [model.config._attn_implementation]
    )


def test_every_change_at_once_applies_and_is_undone_after_an_error(stock):
    before = state_of(stock)
    with pytest.raises(RuntimeError, match="midway"):
        with model_change.changed(
            stock, patch=True, form=FORM, memory_cut=True, pad_guard=False, split_over=2000, count_interleave=True
        ) as done:
            layers = [m for m in stock.modules() if isinstance(m, ClefGatedDeltaNet)]
            assert len(layers) == 6 and done.form.form == FORM and done.split > 0
            assert all(m.chunk_gated_delta_rule.form == kernel_form.parse(FORM) for m in layers)
            assert all(not m.chunk_gated_delta_rule.carry_state and not m.pad_decay_guard for m in layers)
            assert any(isinstance(m, SplitLinear) for m in stock.modules())
            x = torch.randn(1, 8, stock.config.hidden_size)
            with torch.no_grad():
                layers[0](x, attention_mask=torch.ones(1, 8))
            assert done.interleave_calls["calls"] == 2
            raise RuntimeError("midway")
    assert state_of(stock) == before
    assert ClefGatedDeltaNet.pad_decay_guard


def test_the_model_computes_as_before_after_a_change(stock):
    x = torch.randn(1, 70, stock.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = stock(inputs_embeds=x, use_cache=False).last_hidden_state
        with model_change.changed(stock, form=FORM, memory_cut=True):
            cut = stock(inputs_embeds=x, use_cache=False).last_hidden_state
        again = stock(inputs_embeds=x, use_cache=False).last_hidden_state
    assert torch.equal(again, ref) and not torch.allclose(cut, ref, rtol=1e-3)


def test_a_change_with_nothing_to_change_is_refused(stock):
    """pad_guard=False on a stock (unpatched) stack would change nothing, and a control run under it
    would pass for the wrong reason."""
    with pytest.raises(ClefError, match="no ClefGatedDeltaNet"):
        with model_change.changed(stock, pad_guard=False):
            pass
    with pytest.raises(ClefError, match="no GatedDeltaNet"):
        with model_change.changed(torch.nn.Linear(2, 2), memory_cut=True):
            pass


def test_a_built_model_is_not_the_changed_one(tiny_snapshot):
    """patch.load keeps its patch and form; a change inside it is undone back to that, not to stock."""
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    kernels = [m.chunk_gated_delta_rule for m in gated_delta.gated_deltanets(model)]
    with model_change.changed(model, form="R32+dd+vs3"):
        pass
    assert [m.chunk_gated_delta_rule for m in gated_delta.gated_deltanets(model)] == kernels
    assert type(model) is patch.ClefTextModel
