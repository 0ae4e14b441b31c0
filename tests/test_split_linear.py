"""scripts/layers/split_linear.py: a Linear over the byte limit computes the same by row blocks,
each block a view of the weight, and the module is put back whatever happens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scripts.layers import split_linear


def linear(out_features=10, in_features=6, bias=True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias)


def state(m: nn.Module) -> dict:
    return {k: (v.data_ptr(), tuple(v.shape)) for k, v in m.state_dict(keep_vars=True).items()}


@pytest.mark.parametrize(
    ("out_features", "row_bytes", "max_bytes", "rows"),
    [(10, 24, 240, 10), (10, 24, 239, 5), (10, 24, 100, 4), (12288, 16384, 128 * 2**20, 6144)],
)
def test_row_blocks_are_the_fewest_equal_blocks_within_the_limit(out_features, row_bytes, max_bytes, rows):
    assert split_linear.row_blocks(out_features, row_bytes, max_bytes) == rows
    assert rows * row_bytes <= max_bytes


def test_a_row_over_the_limit_is_refused():
    with pytest.raises(ValueError, match="one weight row is 24 bytes"):
        split_linear.row_blocks(10, 24, 23)


@pytest.mark.parametrize("bias", [True, False])
def test_split_is_exact_uses_views_and_is_restored(bias):
    m = linear(bias=bias)
    small = nn.Linear(6, 2)  # under the limit: left alone
    model = nn.Sequential(m, nn.ReLU(), small)
    x = torch.randn(3, 6)
    with torch.no_grad():
        want = m(x)
        before = state(model)
        with split_linear.split_linears([model, model], max_bytes=100) as n:
            assert n == 1 and type(m) is split_linear.SplitLinear and type(small) is nn.Linear
            assert m.pieces == 3  # 10 rows of 24 bytes, 4 rows (96 bytes) per block
            pieces = [getattr(m, split_linear.PIECE.format(i)) for i in range(m.pieces)]
            assert all(p.data_ptr() == m.weight.data_ptr() + i * 4 * 24 for i, p in enumerate(pieces))
            assert state(model) == before  # the pieces are not part of the weights
            got = m(x)
        assert type(m) is nn.Linear and not hasattr(m, "pieces") and dict(m.named_buffers()) == {}
        assert state(model) == before
    # the same dot products; the matmul kernel may sum them in another order for another block width
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_restored_when_the_block_raises():
    m = linear()
    with pytest.raises(RuntimeError, match="boom"), split_linear.split_linears([m], max_bytes=100):
        raise RuntimeError("boom")
    assert type(m) is nn.Linear and dict(m.named_buffers()) == {}
