"""Verification of a shared-state pair by chaining, in torch and in the LiteRT interpreter.

- chaining: suffix(prefix(x[:p]), x[p:p+s]) vs row(x[:p+s]) at the suffix positions, for p in
  {1, P/2, P} (1 and P/2 leave the prefix right-padded) and s in {1, S};
- the prefix state vs transformers' own cache after the same tokens (stock classes, fp32): the
  recurrent state divided by 2^vs, the conv state (its last K-1 inputs), K and V at the real slots;
- reuse: one prefix state, three different suffixes, each against its own full row.
Relative error = max |diff| / max |reference|.
"""
from __future__ import annotations

import torch

from scripts import clef_qwen35_patch, model_check, pair_graph
from scripts.clef_host import PairRunner
from scripts.row_graph import ClefRowPrefill


def rel(x, ref) -> float:
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def chaining(runner: PairRunner, row, vocab: int, seed: int) -> list[dict]:
    P, S = runner.P, runner.S
    rows = []
    for p in sorted({1, P // 2, P}):
        for s in sorted({1, S}):
            ids = model_check.random_ids(p + s, vocab, seed + 100 * p + s)
            _, state = runner.prefix(ids[:p])
            hidden = runner.suffix(state, ids[p:])
            with torch.no_grad():
                ref = row(**runner.host.record(ids, P + S))["hidden"][:, p:p + s]
            rows.append({"check": "chaining", "p": p, "s": s, "prefix_padded": p < P,
                         "rel_vs_row": rel(hidden, ref), "finite": bool(torch.isfinite(hidden).all())})
    return rows


def reuse(runner: PairRunner, row, vocab: int, seed: int) -> list[dict]:
    P, S = runner.P, runner.S
    p = P // 2
    shared = model_check.random_ids(p, vocab, seed)
    _, state = runner.prefix(shared)
    rows = []
    for k in range(3):
        question = model_check.random_ids(S, vocab, seed + 1 + k)
        hidden = runner.suffix(state, question)
        with torch.no_grad():
            ref = row(**runner.host.record(shared + question, P + S))["hidden"][:, p:p + S]
        rows.append({"check": "reuse", "p": p, "s": S, "question": k, "rel_vs_row": rel(hidden, ref),
                     "finite": bool(torch.isfinite(hidden).all())})
    return rows


def state_vs_transformers(runner: PairRunner, model, vocab: int, seed: int) -> dict:
    """The prefix state after p = P/2 tokens vs the stock classes' own cache after the same tokens."""
    p = runner.P // 2
    ids = model_check.random_ids(p, vocab, seed)
    _, state = runner.prefix(ids)
    twin = clef_qwen35_patch.stock_twin(model)
    with torch.no_grad():
        cache = twin(inputs_embeds=runner.host.record(ids, p)["embeds"], use_cache=True).past_key_values
    scale = 2.0 ** runner.vs
    out = {"check": "state_vs_transformers", "p": p, "rel": {}}
    for i, layer in enumerate(model.layers):
        c = cache.layers[i]
        if layer.block_type == "linear_attention":
            k1 = layer.linear_attn.conv_kernel_size - 1
            out["rel"][f"gdn{i}_recurrent"] = rel(state.tensors[f"gdn{i}_recurrent"] / scale, c.recurrent_states[0])
            out["rel"][f"gdn{i}_conv"] = rel(state.tensors[f"gdn{i}_conv"], c.conv_states[0][..., -k1:])
        else:
            out["rel"][f"attn{i}_k"] = rel(state.tensors[f"attn{i}_k"][:, :, :p], c.keys)
            out["rel"][f"attn{i}_v"] = rel(state.tensors[f"attn{i}_v"][:, :, :p], c.values)
    slots = state.tensors[pair_graph.SLOTS][0]
    out["rel"][pair_graph.SLOTS] = float((slots - (torch.arange(runner.P) < p).float()).abs().max())
    out["max_rel"] = max(out["rel"].values())
    return out


def check(runner: PairRunner, model, vocab: int, seed: int = 0) -> list[dict]:
    row = ClefRowPrefill(model, runner.P + runner.S).eval()
    return chaining(runner, row, vocab, seed) + reuse(runner, row, vocab, seed + 7) + [
        state_vs_transformers(runner, model, vocab, seed + 13)]
