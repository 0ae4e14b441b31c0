"""scripts/checks/layerwise.py: a stack run one converted layer at a time computes exactly what a
converted copy computes, holds no second copy of the weights, and is put back whatever happens."""

from __future__ import annotations

import copy

import pytest
import torch

from scripts.checks import layerwise, model_check, record_text
from scripts.qwen35 import patch, row_graph, text_stack
from scripts.qwen35.host import Host


@pytest.fixture(scope="module")
def stack(tiny_snapshot):
    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    return model


def embeds(n: int = 70, hidden: int = 64) -> torch.Tensor:
    return torch.randn(1, n, hidden, generator=torch.Generator().manual_seed(3))


def weights(module) -> dict:
    return {k: (v.dtype, v.data_ptr()) for k, v in module.state_dict(keep_vars=True).items()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_one_layer_at_a_time_equals_a_converted_copy(stack, dtype):
    twin = patch.stock_twin(stack)
    x = embeds(hidden=stack.config.hidden_size)
    with torch.no_grad():
        whole = copy.deepcopy(twin).to(dtype)(inputs_embeds=x.to(dtype), use_cache=False).last_hidden_state
        before = weights(twin)
        with layerwise.cast_by_layer(twin, twin.layers, dtype):
            layered = twin(inputs_embeds=x.to(dtype), use_cache=False).last_hidden_state
        assert weights(twin) == before  # fp32 again, the very same storage
    assert layered.dtype == dtype and torch.equal(layered, whole)


def test_the_exact_reference_by_layer_equals_the_float64_copy(stack):
    """model_check's float64 stock reference (the `loop` form, layer by layer) is the old whole-copy one."""
    twin = patch.stock_twin(stack)
    x = embeds(hidden=stack.config.hidden_size)
    with torch.no_grad():
        whole = model_check.in_float64(twin)(inputs_embeds=x.double(), use_cache=False).last_hidden_state
        with model_check.exact_by_layer(twin):
            layered = twin(inputs_embeds=x.double(), use_cache=False).last_hidden_state
    assert torch.equal(layered, whole)


def test_only_one_layer_is_converted_at_a_time(stack):
    """While a layer runs, every other layer's weights are still fp32."""
    twin = patch.stock_twin(stack)
    seen = []

    def look(layer, args, kwargs):
        others = [m for m in twin.layers if m is not layer]
        seen.append(
            (
                {p.dtype for p in layer.parameters()},
                {p.dtype for m in others for p in m.parameters()},
            )
        )

    with torch.no_grad(), layerwise.cast_by_layer(twin, twin.layers, torch.float64):
        handles = [m.register_forward_pre_hook(look, with_kwargs=True) for m in twin.layers]  # after the cast's
        try:
            twin(inputs_embeds=embeds(hidden=stack.config.hidden_size).double(), use_cache=False)
        finally:
            for h in handles:
                h.remove()
    assert len(seen) == len(twin.layers)
    assert all(mine == {torch.float64} and rest == {torch.float32} for mine, rest in seen), seen


def test_everything_is_put_back_when_a_layer_raises(stack):
    twin = patch.stock_twin(stack)
    before = weights(twin)

    def boom(layer, args, kwargs):
        raise RuntimeError("boom")

    handle = twin.layers[2].register_forward_pre_hook(boom, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
            with layerwise.cast_by_layer(twin, twin.layers, torch.float64):
                twin(inputs_embeds=embeds(hidden=stack.config.hidden_size).double(), use_cache=False)
    finally:
        handle.remove()
    assert weights(twin) == before
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in twin.layers)


def test_the_patched_graph_in_float64_by_layer_equals_its_copy(stack, tiny_snapshot):
    """The row graph (constants outside the layers included) in float64 by layer = its float64 copy."""
    from scripts.layers import gated_delta

    model = copy.deepcopy(stack)
    patch.patch(model)
    gated_delta.set_form(model, "R64+sp+ec+dd+vs6")
    host = Host(tiny_snapshot)
    inputs = host.record(record_text.random_ids(50, model.config.vocab_size, 1), 64)
    with torch.no_grad():
        graph = row_graph.ClefRowPrefill(model, 64).eval()
        whole = copy.deepcopy(graph).to(torch.float64)(**{k: v.double() for k, v in inputs.items()})["hidden"]
        with layerwise.cast_by_layer(graph, model.layers, torch.float64):
            layered = graph(**{k: v.double() for k, v in inputs.items()})["hidden"]
        assert graph.causal.dtype == torch.float32
    assert torch.equal(layered, whole)
