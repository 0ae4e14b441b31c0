"""Verification of a shared-state pair by chaining, in torch and in the LiteRT interpreter.

- chaining: suffix(prefix(x[:p]), x[p:p+s]) vs row(x[:p+s]) at the suffix positions, and the
  prefix's own hidden vs the row at the prefix positions, for p in {1, P/2, P} (1 and P/2 leave the
  prefix right-padded) and s in {1, S}. The row is run once per p, over x[:p+S]: its first p+s
  positions are row(x[:p+s])'s, since a real position is blind to what follows it (verify_model's
  causality check holds that exact to its bound);
- the prefix state vs transformers' own cache after the same tokens, the stock classes computed in
  float64 (the bound) and in fp32 (recorded): the recurrent state divided by 2^vs, the conv state
  (its last K-1 inputs), K and V at the real slots, and the slot flags;
- reuse: one prefix state, three different suffixes, each against its own full row.
The three share their P/2 prefix: one state, run once, serves chaining, both controls' comparison,
the stock caches and the three reuse questions (the first is chaining's own suffix), so reuse also
sees a state that several suffixes have already read.
Controls (scripts/checks/controls.py), in the chaining row of the shared P/2 prefix (half padded, so
there is a pad to guard) and one suffix token (all it knows of the context is the state, so a broken
state shows fully, not diluted by suffix tokens that rebuild some of it): the suffix fed the prefix
state with its recurrent states zeroed; and, where the graph can be changed (torch), the prefix run
without the pad guard. A control shows the check can fail; one row each shows it, every row is not
needed.
Errors: scripts/checks/compare.py, global and per position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from scripts.checks import compare, controls, model_check, records
from scripts.pipeline import profile
from scripts.pipeline.mappings import Tensors
from scripts.qwen35 import model_change, pair_graph, patch
from scripts.qwen35.host import PairRunner, PairState
from scripts.qwen35.row_graph import ClefRowPrefill
from scripts.release import references

if TYPE_CHECKING:
    from scripts.checks.record_text import RecordTokens


def chaining_tokens(P: int, S: int, text: RecordTokens, seed: int) -> dict[int, list[int]]:
    """{p: p + S token ids} per chaining prefix length p: a suffix of s tokens reads the first p + s."""
    return {p: text.ids(p + S, seed + 100 * p) for p in records.chaining_lengths(P, S)[0]}


class PrefixRuns:
    """A runner's prefix, run once per token sequence and kept for the checks that share it."""

    def __init__(self, runner: PairRunner):
        self.runner, self.kept = runner, {}

    def __call__(self, ids) -> tuple[torch.Tensor, PairState]:
        key = tuple(ids)
        if key not in self.kept:
            self.kept[key] = self.runner.prefix(list(ids))
        return self.kept[key]


def shared_prefix(
    runner: PairRunner, text: RecordTokens, seed: int, prefixes: PrefixRuns | None
) -> tuple[list[int], PairState]:
    """The tokens chaining runs at p = records.shared_length(P) (p + S of them), and the state after their
    first p, from `prefixes` when a check() shares its runs, else run here."""
    p = records.shared_length(runner.P)
    tokens = chaining_tokens(runner.P, runner.S, text, seed)[p]
    _, state = (prefixes or PrefixRuns(runner))(tokens[:p])
    return tokens, state


def chaining(
    runner: PairRunner,
    refs: References,
    text: RecordTokens,
    seed: int,
    pad_guard_control: bool = False,
    prefixes: PrefixRuns | None = None,
) -> list[dict]:
    """pad_guard_control: also chain with the prefix run with pads that decay the state (model_change's
    pad_guard=False, on refs' stack; only a torch runner of that stack can: a LiteRT graph has its guard
    built in, and a control that changes nothing fails as unable to see its fault)."""
    P, S = runner.P, runner.S
    prefixes = prefixes or PrefixRuns(runner)
    rows = []
    _, suffixes = records.chaining_lengths(P, S)
    for p, tokens in chaining_tokens(P, S, text, seed).items():
        prefix_hidden, state = prefixes(tokens[:p])  # one prefix run serves every s
        ref = refs.row(tokens)  # one row run serves every s (causality: see the module docstring)
        controlled = p == records.shared_length(P)
        unguarded = None
        if controlled and pad_guard_control and p < P:
            with model_change.changed(refs.model, pad_guard=False):  # the stack the torch runner runs
                _, unguarded = runner.prefix(tokens[:p])
        for s in suffixes:
            ids = tokens[: p + s]
            hidden = runner.suffix(state, ids[p:])
            r = {
                "check": "chaining",
                "p": p,
                "s": s,
                "prefix_padded": p < P,
                **compare.figures("vs_row", hidden, ref[:, p : p + s]),
                "finite": bool(torch.isfinite(hidden).all()),
            }
            if controlled and s == suffixes[0]:  # the controls: see the module docstring
                cut = PairState(controls.zero_recurrent(state.tensors), state.form, state.vs, state.real_length)
                r["control_zero_state_rel_vs_row"] = compare.rel(runner.suffix(cut, ids[p:]), ref[:, p : p + s])
                if unguarded is not None:
                    r["control_no_pad_guard_rel_vs_row"] = compare.rel(
                        runner.suffix(unguarded, ids[p:]), ref[:, p : p + s]
                    )
            rows.append(r)
            if s == suffixes[0]:  # the prefix hidden does not depend on s
                rows.append(
                    {
                        "check": "prefix_hidden",
                        "p": p,
                        **compare.figures("vs_row", prefix_hidden, ref[:, :p]),
                        "finite": bool(torch.isfinite(prefix_hidden).all()),
                    }
                )
    return rows


def reuse(
    runner: PairRunner, refs: References, text: RecordTokens, seed: int, prefixes: PrefixRuns | None = None
) -> list[dict]:
    P, S = runner.P, runner.S
    p = records.shared_length(P)
    tokens, state = shared_prefix(runner, text, seed, prefixes)
    shared = tokens[:p]
    rows = []
    for k in range(3):
        question = tokens[p:] if k == 0 else text.ids(S, seed + k)
        hidden = runner.suffix(state, question)
        ref = refs.row(shared + question)[:, p : p + S]
        rows.append(
            {
                "check": "reuse",
                "p": p,
                "s": S,
                "question": k,
                **compare.figures("vs_row", hidden, ref),
                "finite": bool(torch.isfinite(hidden).all()),
            }
        )
    return rows


class References:
    """The torch side of every pair check, computed once per token sequence and kept: the row graph's
    hidden [1, P+S, H] after the tokens, and transformers' stock caches after a prefix (float64, the
    truth, one layer at a time; and fp32) as our state's entries. Checks run in torch first fill it;
    after free() the stack can go and the interpreter's checks read what is kept (a sequence not seen
    before is then an error naming it, never a silent recomputation)."""

    def __init__(self, model, host, P: int, S: int):
        self.model, self.host, self.P, self.S, self.length = model, host, P, S, P + S
        self.graph = ClefRowPrefill(model, P + S).eval()
        self.twin = patch.stock_twin(model)
        self.hidden, self.caches = {}, {}

    def _need(self, what: str, ids) -> None:
        if self.model is None:
            raise RuntimeError(
                f"no {what} kept for {len(ids)} tokens {list(ids)[:4]}...: the torch checks did not compute it"
            )

    def row(self, ids) -> torch.Tensor:
        key = tuple(ids)
        if key not in self.hidden:
            self._need("row hidden", ids)
            with torch.no_grad(), profile.part("torch"):
                self.hidden[key] = self.graph(**self.host.record(list(ids), self.length))["hidden"]
        return self.hidden[key]

    def stock_state(self, ids) -> tuple[Tensors, Tensors]:
        """-> (float64, fp32) stock cache entries after the tokens `ids` (cache_entries)."""
        key = tuple(ids)
        if key not in self.caches:
            self._need("stock cache", ids)
            embeds = self.host.record(list(ids), len(ids))["embeds"][:, : len(ids)]
            with torch.no_grad():
                with model_check.exact_by_layer(self.twin):
                    exact = self.twin(inputs_embeds=embeds.double(), use_cache=True).past_key_values
                with profile.part("torch"):
                    fp32 = self.twin(inputs_embeds=embeds, use_cache=True).past_key_values
            self.caches[key] = (cache_entries(self.model, exact), cache_entries(self.model, fp32))
        return self.caches[key]

    def free(self) -> None:
        """Drop every reference to the stack: only the kept results stay."""
        self.model = self.graph = self.twin = None


def cache_entries(model, cache) -> Tensors:
    """A stock cache as our state's entries: {name: tensor} (the recurrent state unscaled)."""
    out = {}
    for i, layer in enumerate(model.layers):
        c = cache.layers[i]
        if layer.block_type == "linear_attention":
            k1 = layer.linear_attn.conv_kernel_size - 1
            out[f"gdn{i}_recurrent"] = c.recurrent_states[0]
            out[f"gdn{i}_conv"] = c.conv_states[0][..., -k1:]
        else:
            out[f"attn{i}_k"], out[f"attn{i}_v"] = c.keys, c.values
    return out


def state_vs_transformers(
    runner: PairRunner, refs: References, text: RecordTokens, seed: int, prefixes: PrefixRuns | None = None
) -> list[dict]:
    """The prefix state after p = P/2 tokens vs the stock caches after the same tokens: a row per entry."""
    p = records.shared_length(runner.P)
    tokens, state = shared_prefix(runner, text, seed, prefixes)
    ids = tokens[:p]
    exact, fp32 = refs.stock_state(ids)
    scale = 2.0**runner.vs
    rows = []
    for name, ref in exact.items():
        ours = state.tensors[name]
        ours = ours / scale if name.endswith("_recurrent") else (ours[:, :, :p] if name.startswith("attn") else ours)
        dim = pair_graph.position_dim(name)
        rows.append(
            {
                "check": "state",
                "p": p,
                "entry": name,
                **compare.figures("state_vs_stock_f64", ours, ref, dim),
                **compare.figures("state_vs_stock_fp32", ours, fp32[name], dim),
                "finite": bool(torch.isfinite(ours).all()),
            }
        )
    slots = state.tensors[pair_graph.SLOTS]
    rows.append(
        {
            "check": "state",
            "p": p,
            "entry": pair_graph.SLOTS,
            **compare.figures("state_vs_stock_f64", slots, (torch.arange(runner.P) < p).float()[None], None),
            "finite": bool(torch.isfinite(slots).all()),
        }
    )
    return rows


def check(
    runner: PairRunner, refs: References, text: RecordTokens, seed: int = 0, pad_guard_control: bool = False
) -> list[dict]:
    prefixes = PrefixRuns(runner)  # the P/2 prefix is run once for all three
    return (
        chaining(runner, refs, text, seed, pad_guard_control, prefixes)
        + reuse(runner, refs, text, seed, prefixes)
        + state_vs_transformers(runner, refs, text, seed, prefixes)
    )


def reference_record(refs: References, host, text: RecordTokens, seed: int = 0) -> Tensors:
    """The pair's reference record for the release (scripts/release/references.py): check()'s shared
    half-full prefix, then its full suffix, against the row it was checked against."""
    p = records.shared_length(refs.P)
    tokens = chaining_tokens(refs.P, refs.S, text, seed)[p]
    return references.pair_reference(host, tokens, p, refs.P, refs.S, refs.row(tokens))
