"""The host tables at a release's host_weights_precision (scripts/qwen35/host_tables.py): stored with the
graphs' formulas, read back by the host a slice at a time to exactly those values."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from scripts.layers import weight_precision
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import host_tables
from scripts.qwen35.host import MappedSafetensors

TABLE = torch.randn(300, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)


def stored(precision: str, tmp_path) -> host_tables.QuantizedTable | torch.Tensor:
    path = tmp_path / f"{precision}.safetensors"
    save_file({"t" + k: v for k, v in host_tables.encode(TABLE, precision).items()}, str(path))
    return host_tables.read(MappedSafetensors(path), "t")


@pytest.mark.parametrize("precision", ["int8", "int4", "int4b32"])
def test_a_quantized_table_reads_back_the_values_the_graphs_formula_gives(precision, tmp_path):
    table = stored(precision, tmp_path)
    want = weight_precision.stored_values(TABLE.to(torch.float32), precision)
    assert isinstance(table, host_tables.QuantizedTable) and table.shape == TABLE.shape
    assert table.precision == precision
    assert torch.equal(table[:], want)
    ids = torch.tensor([5, 0, 299, 5])
    assert torch.equal(table[ids], want[ids]) and torch.equal(table[7], want[7])
    assert torch.equal(table[100:164], want[100:164])  # a block of vocabulary rows (decision.log_probs)
    assert not torch.equal(want, TABLE.to(torch.float32))  # it is quantized


def test_the_stored_bytes_are_what_the_file_holds(tmp_path):
    for precision in ("bf16", "int8", "int4", "int4b32"):
        parts = host_tables.encode(TABLE, precision)
        held = sum(t.numel() * t.element_size() for t in parts.values())
        assert held == host_tables.stored_bytes(tuple(TABLE.shape), precision), precision
    assert host_tables.stored_bytes((248320, 4096), "int4b32") < 0.3 * host_tables.stored_bytes((248320, 4096), "bf16")


def test_bf16_is_the_table_itself_and_other_precisions_are_refused(tmp_path):
    assert torch.equal(stored("bf16", tmp_path), TABLE)
    with pytest.raises(ClefError, match="the host tables are bf16, int8 or int4"):
        host_tables.encode(TABLE, "fp16")
    with pytest.raises(ClefError, match="weights 'int3' is not one of"):
        host_tables.encode(TABLE, "int3")
    with pytest.raises(ClefError, match="width 64 is not a multiple of the block 128"):
        host_tables.encode(TABLE, "int4b128")


def test_codes_without_their_scales_are_refused(tmp_path):
    path = tmp_path / "bare.safetensors"
    save_file({"t": host_tables.encode(TABLE, "int8")[""]}, str(path))
    with pytest.raises(ClefError, match="t holds integer codes without their scales"):
        host_tables.read(MappedSafetensors(path), "t")
