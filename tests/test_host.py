"""The host side: rotary tables equal transformers', records, logits, and inputs refused before a graph runs."""

from __future__ import annotations

import pytest
import torch

from scripts.pipeline.errors import ClefError
from scripts.qwen35.host import Host, inverse_frequencies, rope_tables, text_positions


@pytest.fixture(scope="module")
def host(tiny_snapshot):
    return Host(tiny_snapshot)


@pytest.mark.parametrize("start", [0, 1000])
def test_rope_tables_equal_transformers(host, tiny_snapshot, start):
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    cfg = AutoConfig.from_pretrained(str(tiny_snapshot)).text_config
    rotary = Qwen3_5TextRotaryEmbedding(config=cfg)
    positions = torch.arange(start, start + 96)[None]
    cos_ref, sin_ref = rotary(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = rope_tables(host.rope, host.head_dim, text_positions(start, 96))
    assert cos.shape == (96, host.rotary) == tuple(cos_ref.shape[1:])
    assert (cos - cos_ref[0]).abs().max() <= 1e-6 and (sin - sin_ref[0]).abs().max() <= 1e-6


def test_mrope_interleave_uses_each_axis(host):
    """With distinct T/H/W positions, the slots follow the interleave [T H W T H W ... T T]."""
    positions = torch.tensor([[5], [50], [500]])
    cos, _ = rope_tables(host.rope, host.head_dim, positions)
    inv = inverse_frequencies(host.rope, host.head_dim)
    half = len(inv)
    sec = host.rope["mrope_section"]
    axis = [0] * half
    for a in (1, 2):
        for j in range(a, sec[a] * 3, 3):
            axis[j] = a
    expected = torch.tensor([float(positions[axis[j], 0]) for j in range(half)]) * inv
    assert torch.allclose(cos[0, :half], expected.cos()) and set(axis) == {0, 1, 2}


def test_record_pads_and_widens(host):
    ids = host.encode("the state is in order")
    rec = host.record(ids, 64, start=10)
    n = len(ids)
    assert rec["embeds"].dtype == torch.float32 and rec["embeds"].shape == (1, 64, host.hidden_size)
    assert torch.equal(rec["embeds"][0, :n], host.embed_tokens[torch.tensor(ids)].float())
    assert not rec["embeds"][0, n:].any()
    assert rec["valid"][0, :n].eq(1).all() and not rec["valid"][0, n:].any()
    cos, _ = rope_tables(host.rope, host.head_dim, text_positions(10, 1))
    assert torch.equal(rec["cos"][0, 0], cos[0])
    assert host.check(rec, 64) == n


def test_logits_use_the_bf16_lm_head(host):
    hidden = torch.randn(3, host.hidden_size)
    logits = host.logits(hidden)
    assert logits.shape == (3, host.lm_head.shape[0])
    assert torch.allclose(logits, hidden @ host.lm_head.float().T)


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda r: r["valid"].__setitem__((0, 3), 0.0), "hole"),
        (lambda r: r["valid"].__setitem__((0, 0), 0.0), "start with 1.0"),
        (lambda r: r["valid"].__setitem__((0, 2), 0.5), "only 0.0 and 1.0"),
        (lambda r: r.__setitem__("embeds", r["embeds"][..., :-1]), "width"),
        (lambda r: r.__setitem__("valid", r["valid"][:, :32]), r"valid of shape \[1, 32\]"),
        (lambda r: r.__setitem__("cos", r["cos"][:, :, :4]), "cos of shape"),
    ],
)
def test_bad_inputs_refused(host, mutate, fragment):
    rec = host.record(list(range(10)), 64)
    mutate(rec)
    with pytest.raises(ClefError, match=fragment):
        host.check(rec, 64)


def test_length_that_does_not_match_the_graph(host):
    rec = host.record(list(range(10)), 64)
    with pytest.raises(ClefError, match="do not fit a graph of L=128"):
        host.check(rec, 128)


def test_record_refusals(host):
    with pytest.raises(ClefError, match="do not fit a graph of L=4"):
        host.record(list(range(5)), 4)
    with pytest.raises(ClefError, match="at least one token"):
        host.record([], 4)
    with pytest.raises(ClefError, match="token id out of range"):
        host.record([10**6], 4)


def test_host_tables_are_mapped_not_read(tmp_path):
    """A host table is the file's pages: equal to safetensors' own read, a record's rows cost no anonymous
    memory for the whole table (clef-flash's embed_tokens is 2 GB), and a write never reaches the file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from scripts.pipeline import measure
    from scripts.qwen35.host import mapped_tensor

    table = torch.randn(25_000, 4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)  # 205 MB
    path = tmp_path / "model.safetensors"
    save_file({"small": torch.arange(6, dtype=torch.float32), "embed": table}, str(path))
    digest = path.read_bytes()
    del table
    before = measure.memory_status().anon
    mapped = mapped_tensor(path, "embed")
    rows = mapped[torch.tensor([3, 17, 24_999])].float()
    grown = measure.memory_status().anon - before
    assert grown < 20 * 2**20, grown
    with safe_open(str(path), framework="pt") as f:
        assert torch.equal(mapped, f.get_tensor("embed")) and torch.equal(
            rows, f.get_tensor("embed")[[3, 17, 24_999]].float()
        )
        assert torch.equal(mapped_tensor(path, "small"), f.get_tensor("small"))
    mapped[0, 0] = 7.0
    assert path.read_bytes() == digest
    with pytest.raises(ClefError, match="has no tensor lm_head"):
        mapped_tensor(path, "lm_head")


@pytest.mark.parametrize("precision", ["int8", "int4b32"])
def test_a_release_with_quantized_host_tables_is_read_as_their_values(host, tiny_snapshot, tmp_path, precision):
    """The release stage stores the tables at release.host_weights_precision (builder.host_files); the host
    of that release looks rows up and computes logits from exactly the stored values."""
    from scripts.layers import weight_precision
    from scripts.release import builder

    section = builder.host_files(tiny_snapshot, host, tmp_path, "include", precision)
    assert section.precision == precision
    released = Host(tmp_path / "host")
    for role in ("embed_tokens", "lm_head"):
        got, src = getattr(released, role), getattr(host, role)
        assert torch.equal(got[:], weight_precision.stored_values(src.to(torch.float32), precision)), role
    rec = released.record([3, 1, 4], 8)
    assert torch.equal(rec["embeds"][0, :3], released.embed_tokens[torch.tensor([3, 1, 4])])
    hidden = torch.randn(2, host.hidden_size)
    assert torch.equal(released.logits(hidden), hidden @ released.lm_head[:].T)
    assert builder.host_files(tiny_snapshot, host, tmp_path / "bf16", "include").precision is None
