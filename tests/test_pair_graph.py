"""Shared-state pairs in torch: chaining with a padded prefix, state reuse, the state against
transformers' cache, and the host's refusals (wrong scale, wrong shape, too long)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from scripts.checks import compare, pair_check, record_text
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host, PairRunner, PairState

FORM = "R64+sp+ec+dd+vs6"
PRE, SUF = 64, 16


@pytest.fixture(scope="module")
def setup(tiny_snapshot):
    model, _, _ = patch.load(tiny_snapshot, FORM, progress=False)
    host = Host(tiny_snapshot)
    runner = make_runner(model, host, FORM)
    return model, host, runner


def make_runner(model, host, form):
    shapes = pair_graph.state_shapes(model, PRE)

    def fn(module):
        def call(**inputs):
            with torch.no_grad():
                return dict(module(**inputs))

        return call

    return PairRunner(
        host,
        fn(pair_graph.PairPrefix(model, PRE).eval()),
        fn(pair_graph.PairSuffix(model, PRE, SUF).eval()),
        PRE,
        SUF,
        form,
        shapes,
    )


def test_chaining_matches_the_row_including_padded_prefixes(setup):
    """Suffix and prefix hidden against the row, global and per position; the controls break the bound."""
    model, _, runner = setup
    refs = pair_check.References(model, runner.host, PRE, SUF)
    rows = pair_check.chaining(
        runner, refs, record_text.RandomIds(model.config.vocab_size), seed=3, pad_guard_control=True
    )
    chained = [r for r in rows if r["check"] == "chaining"]
    assert {(r["p"], r["s"]) for r in chained} == {(1, 1), (1, SUF), (32, 1), (32, SUF), (64, 1), (64, SUF)}
    assert {r["p"] for r in rows if r["check"] == "prefix_hidden"} == {1, 32, 64}
    assert any(r["prefix_padded"] for r in chained)
    assert max(max(r["rel_vs_row"], r["rel_per_position_vs_row"]) for r in rows) < 1e-5, rows
    # the controls, in the P/2 row with one suffix token: the recurrent state zeroed, the pad guard removed
    for key in ("control_zero_state_rel_vs_row", "control_no_pad_guard_rel_vs_row"):
        controlled = [r for r in chained if key in r]
        assert [(r["p"], r["s"]) for r in controlled] == [(PRE // 2, 1)], key
        assert controlled[0][key] > 100 * 1e-4, (key, controlled[0][key])


def test_padded_prefix_conv_state_comes_from_the_last_real_tokens(setup):
    """The conv state after p real tokens padded to P equals the one after the same p tokens unpadded."""
    model, host, runner = setup
    ids = list(range(5, 25))
    _, padded = runner.prefix(ids)
    exact = pair_graph.PairPrefix(model, len(ids)).eval()
    with torch.no_grad():
        bare = exact(**host.record(ids, len(ids)))
    for name, t in padded.tensors.items():
        if name.endswith("_conv") or name.endswith("_recurrent"):
            assert compare.rel(t, bare[name]) < 1e-5, name


def test_one_state_many_suffixes(setup):
    model, _, runner = setup
    rows = pair_check.reuse(
        runner,
        pair_check.References(model, runner.host, PRE, SUF),
        record_text.RandomIds(model.config.vocab_size),
        seed=9,
    )
    assert len(rows) == 3 and max(r["rel_vs_row"] for r in rows) < 1e-5


def test_references_are_kept_for_the_interpreter_after_the_stack_is_freed(setup):
    """What the torch checks computed is read back after free() (the stack gone); a sequence they did
    not compute is an error, not a silent recomputation with no stack."""
    model, _, runner = setup
    refs = pair_check.References(model, runner.host, PRE, SUF)
    first = pair_check.check(runner, refs, record_text.RandomIds(model.config.vocab_size), seed=2)
    refs.free()
    assert refs.model is None and refs.twin is None and refs.graph is None
    again = pair_check.check(runner, refs, record_text.RandomIds(model.config.vocab_size), seed=2)
    assert again == first
    with pytest.raises(RuntimeError, match="the torch checks did not compute it"):
        pair_check.check(runner, refs, record_text.RandomIds(model.config.vocab_size), seed=3)


def test_state_matches_transformers_cache_in_float64(setup):
    model, _, runner = setup
    rows = pair_check.state_vs_transformers(
        runner,
        pair_check.References(model, runner.host, PRE, SUF),
        record_text.RandomIds(model.config.vocab_size),
        seed=1,
    )
    assert {r["entry"] for r in rows} == set(pair_graph.state_names(model))
    assert max(r["rel_state_vs_stock_f64"] for r in rows) < 1e-4, rows  # verify_pair's bound
    assert all("rel_per_position_state_vs_stock_f64" in r for r in rows if r["entry"].endswith(("_k", "_v", "_conv")))
    assert all("rel_state_vs_stock_fp32" in r for r in rows if r["entry"] != pair_graph.SLOTS)


def test_wrong_scale_state_refused(setup):
    model, host, runner = setup
    _, state = runner.prefix([1, 2, 3])
    vs8 = make_runner(model, host, "R64+sp+ec+dd+vs8")
    with pytest.raises(ClefError, match=r"state was produced under R64\+sp\+ec\+dd\+vs6 .* x 2\^6.* needs x 2\^8"):
        vs8.suffix(state, [4, 5])


def test_wrong_shape_and_lengths_refused(setup):
    _, _, runner = setup
    _, state = runner.prefix([1, 2, 3])
    name = next(iter(runner.state_shapes))
    bad = PairState({**state.tensors, name: state.tensors[name][..., :1]}, state.form, state.vs, state.real_length)
    with pytest.raises(ClefError, match=f"state tensor {name} has shape"):
        runner.suffix(bad, [4])
    with pytest.raises(ClefError, match="longer than the pair's S=16"):
        runner.suffix(state, list(range(SUF + 1)))
    with pytest.raises(ClefError, match="longer than the pair's P=64"):
        runner.prefix(list(range(PRE + 1)))


def test_state_is_rank4_and_named(setup):
    model, _, runner = setup
    _, state = runner.prefix([1, 2, 3])
    assert set(state.tensors) == set(pair_graph.state_names(model))
    assert all(t.dim() <= 4 and t.dtype == torch.float32 for t in state.tensors.values())


def test_the_checks_share_the_half_prefix_and_one_row_per_prefix_length(setup):
    """check() runs the prefix once per chaining length (plus the unguarded control on the P/2 one)
    and the row once per chaining length and reuse question: the P/2 prefix serves chaining,
    reuse and the stock-cache check; a chaining row with s < S is the head of the row over p + S tokens,
    exactly what the row over p + s tokens gives (causality)."""
    model, host, runner = setup
    prefix_calls, row_calls = [], []
    counting = PairRunner(host, None, runner.suffix_fn, PRE, SUF, FORM, runner.state_shapes)
    counting.prefix_fn = lambda **inputs: prefix_calls.append(1) or runner.prefix_fn(**inputs)
    refs = pair_check.References(model, host, PRE, SUF)
    graph = refs.graph
    refs.graph = lambda **inputs: row_calls.append(1) or graph(**inputs)
    rows = pair_check.check(
        counting, refs, record_text.RandomIds(model.config.vocab_size), seed=4, pad_guard_control=True
    )
    assert len(prefix_calls) == 3 + 1  # p in {1, 32, 64}, and the unguarded p = 32
    assert len(row_calls) == 3 + 2  # one per p, and reuse's two questions beyond chaining's own
    assert {r["check"] for r in rows} == {"chaining", "prefix_hidden", "reuse", "state"}
    tokens = pair_check.chaining_tokens(PRE, SUF, record_text.RandomIds(model.config.vocab_size), 4)[32]
    with torch.no_grad():
        head = graph(**host.record(tokens[:33], PRE + SUF))["hidden"][:, 32:33]
    assert compare.rel(refs.row(tokens)[:, 32:33], head) < 1e-6


def test_the_pair_contract_is_the_json_every_pair_graph_embeds(setup):
    """The contract is a record; the JSON a pair graph's metadata holds is byte for byte what the dict
    it replaced wrote (the pin is that dict's sha256 at this model and form), key order included: the
    hidden output names its shape last, every other tensor second."""
    doc = pair_graph.contract(setup[0], PRE, SUF, FORM).to_json()
    assert list(doc) == ["graph", "version", "P", "S", "form", "recurrent_state_scale", "signatures", "rule"]
    hidden, first_state = doc["signatures"]["suffix"]["outputs"][:2]
    assert list(hidden) == ["name", "dtype", "meaning", "shape"] and hidden["name"] == "hidden"
    assert list(first_state) == ["name", "shape", "dtype", "meaning"]
    pinned = "207ca2633c79a3753b2d73dc08fde9d4eabb744f95ed3e24910b2232042d8482"
    assert hashlib.sha256(json.dumps(doc).encode()).hexdigest() == pinned
