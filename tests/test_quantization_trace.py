"""The quantization trace's groups and its restoring block (scripts/bench/quantization_trace.py)."""

from __future__ import annotations

import pytest
import torch

from scripts.bench import quantization_trace
from scripts.pipeline.errors import ClefError


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.ModuleDict({"up_proj": torch.nn.Linear(64, 32), "down_proj": torch.nn.Linear(32, 64)})


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer() for _ in range(3)])
        self.lm_head = torch.nn.Linear(64, 10)  # not a layer's: never traced


def test_linears_group_by_role_over_layers_and_by_layer():
    by_role, by_layer = quantization_trace.groups(Stack())
    assert {k: len(v) for k, v in by_role.items()} == {"mlp.up_proj": 3, "mlp.down_proj": 3}
    assert list(by_layer) == ["0", "1", "2"] and all(len(v) == 2 for v in by_layer.values())
    with pytest.raises(ClefError, match="holds no layer Linears to trace"):
        quantization_trace.groups(torch.nn.Linear(4, 4))


def test_a_group_is_quantized_inside_the_block_and_put_back_after_even_on_failure():
    model = Stack()
    linears = [model.layers[0].mlp["up_proj"]]
    before = linears[0].weight.detach().clone()
    with quantization_trace.quantized(linears, "int4"):
        assert linears[0].weight.detach().unique().numel() <= 15 * 32  # at most 15 codes a row
        assert not torch.equal(linears[0].weight, before)
    assert torch.equal(linears[0].weight, before)
    with pytest.raises(RuntimeError), quantization_trace.quantized(linears, "int4b32"):
        raise RuntimeError("stopped")
    assert torch.equal(linears[0].weight, before)
