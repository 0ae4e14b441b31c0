"""Verification of a shared-state pair by chaining, in torch and in the LiteRT interpreter.

- chaining: suffix(prefix(x[:p]), x[p:p+s]) vs row(x[:p+s]) at the suffix positions, and the
  prefix's own hidden vs the row at the prefix positions, for p in {1, P/2, P} (1 and P/2 leave the
  prefix right-padded) and s in {1, S};
- the prefix state vs transformers' own cache after the same tokens, the stock classes computed in
  float64 (the bound) and in fp32 (recorded): the recurrent state divided by 2^vs, the conv state
  (its last K-1 inputs), K and V at the real slots, and the slot flags;
- reuse: one prefix state, three different suffixes, each against its own full row.
Controls (scripts/checks/controls.py), in every chaining row: the suffix fed the prefix state with its
recurrent states zeroed; and, where the graph can be changed (torch), the prefix run without the pad
guard. Errors: scripts/checks/compare.py, global and per position.
"""

from __future__ import annotations

import torch

from scripts.checks import compare, controls, model_check
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import PairRunner, PairState
from scripts.qwen35.row_graph import ClefRowPrefill


def chaining_lengths(P: int, S: int) -> tuple[list[int], list[int]]:
    """The prefix lengths p and suffix lengths s a chaining check covers: 1, P/2 and P real prefix
    tokens (the most padding, half, none), 1 and S real suffix tokens."""
    return sorted({1, P // 2, P}), sorted({1, S})


def chaining(
    runner: PairRunner, refs: References, vocab: int, seed: int, pad_guard_control: bool = False
) -> list[dict]:
    """pad_guard_control: also chain with the prefix run under controls.without_pad_guard() (only a
    torch runner can: a LiteRT graph has its guard built in)."""
    P, S = runner.P, runner.S
    rows = []
    prefixes, suffixes = chaining_lengths(P, S)
    for p in prefixes:
        tokens = model_check.random_ids(p + S, vocab, seed + 100 * p)  # each s reads its first p + s
        prefix_hidden, state = runner.prefix(tokens[:p])  # one prefix run serves every s
        cut = PairState(controls.zero_recurrent(state.tensors), state.form, state.vs, state.real_length)
        if pad_guard_control:
            with controls.without_pad_guard():
                _, unguarded = runner.prefix(tokens[:p])
        for s in suffixes:
            ids = tokens[: p + s]
            hidden = runner.suffix(state, ids[p:])
            ref = refs.row(ids)
            r = {
                "check": "chaining",
                "p": p,
                "s": s,
                "prefix_padded": p < P,
                **compare.figures("vs_row", hidden, ref[:, p : p + s]),
                "control_zero_state_rel_vs_row": compare.rel(runner.suffix(cut, ids[p:]), ref[:, p : p + s]),
                "finite": bool(torch.isfinite(hidden).all()),
            }
            if pad_guard_control:
                r["control_no_pad_guard_rel_vs_row"] = compare.rel(runner.suffix(unguarded, ids[p:]), ref[:, p : p + s])
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


def reuse(runner: PairRunner, refs: References, vocab: int, seed: int) -> list[dict]:
    P, S = runner.P, runner.S
    p = P // 2
    shared = model_check.random_ids(p, vocab, seed)
    _, state = runner.prefix(shared)
    rows = []
    for k in range(3):
        question = model_check.random_ids(S, vocab, seed + 1 + k)
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
        self.model, self.host, self.length = model, host, P + S
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
            with torch.no_grad():
                self.hidden[key] = self.graph(**self.host.record(list(ids), self.length))["hidden"]
        return self.hidden[key]

    def stock_state(self, ids) -> tuple[dict, dict]:
        """-> (float64, fp32) stock cache entries after the tokens `ids` (cache_entries)."""
        key = tuple(ids)
        if key not in self.caches:
            self._need("stock cache", ids)
            embeds = self.host.record(list(ids), len(ids))["embeds"][:, : len(ids)]
            with torch.no_grad():
                with model_check.exact_by_layer(self.twin):
                    exact = self.twin(inputs_embeds=embeds.double(), use_cache=True).past_key_values
                fp32 = self.twin(inputs_embeds=embeds, use_cache=True).past_key_values
            self.caches[key] = (cache_entries(self.model, exact), cache_entries(self.model, fp32))
        return self.caches[key]

    def free(self) -> None:
        """Drop every reference to the stack: only the kept results stay."""
        self.model = self.graph = self.twin = None


def cache_entries(model, cache) -> dict:
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


def state_vs_transformers(runner: PairRunner, refs: References, vocab: int, seed: int) -> list[dict]:
    """The prefix state after p = P/2 tokens vs the stock caches after the same tokens: a row per entry."""
    p = runner.P // 2
    ids = model_check.random_ids(p, vocab, seed)
    _, state = runner.prefix(ids)
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
    runner: PairRunner, refs: References, vocab: int, seed: int = 0, pad_guard_control: bool = False
) -> list[dict]:
    return (
        chaining(runner, refs, vocab, seed, pad_guard_control)
        + reuse(runner, refs, vocab, seed + 7)
        + state_vs_transformers(runner, refs, vocab, seed + 13)
    )
