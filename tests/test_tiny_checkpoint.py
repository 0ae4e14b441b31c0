"""The embedded checkpoint: deterministic, clef-flash's structure, loadable by stock transformers."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from scripts.checkpoint import fetch, snapshot, tiny_checkpoint


def test_same_bytes_every_time(tiny_cache, tmp_path):
    """Two writes give the same revision and the same sha256 for every file."""
    _, rec = tiny_cache
    repo, revision = fetch.write_tiny(tmp_path / "hf")
    again = snapshot.record(
        snapshot.snapshot_dir(tmp_path / "hf", repo, revision), "tiny", repo, revision, root=tmp_path
    )
    assert revision == rec.revision
    assert again.files == rec.files
    assert len(revision) == 40 and int(revision, 16) >= 0


def test_layout_is_the_hub_cache(tiny_snapshot):
    assert tiny_snapshot.parent.name == "snapshots"
    assert tiny_snapshot.parents[1].name == "models--" + tiny_checkpoint.REPO.replace("/", "--")
    assert (tiny_snapshot.parents[1] / "refs" / "main").read_text() == tiny_snapshot.name
    names = {p.name for p in tiny_snapshot.iterdir()}
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) >= 2 and "model.safetensors.index.json" in names
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names


def test_config_has_clef_flash_structure(tiny_snapshot):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(tiny_snapshot))
    assert cfg.architectures == ["Qwen3_5ForConditionalGeneration"] and not cfg.tie_word_embeddings
    text = cfg.text_config
    assert text.num_hidden_layers >= 8
    assert [i for i, t in enumerate(text.layer_types) if t == "full_attention"] == list(
        range(3, text.num_hidden_layers, 4)
    )
    assert text.linear_num_value_heads == 2 * text.linear_num_key_heads
    assert (
        text.num_attention_heads % text.num_key_value_heads == 0 and text.num_key_value_heads < text.num_attention_heads
    )
    rope = text.rope_parameters
    assert rope["partial_rotary_factor"] == 0.25 and rope["mrope_interleaved"] is True
    assert sum(rope["mrope_section"]) == int(text.head_dim * 0.25) // 2
    assert text.attn_output_gate is True


def test_tensors_are_bf16_with_vision_and_mtp(tiny_snapshot):
    from safetensors import safe_open

    wmap = json.loads((tiny_snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(k.startswith("model.visual.") for k in wmap) and any(k.startswith("mtp.") for k in wmap)
    assert "lm_head.weight" in wmap and "model.language_model.embed_tokens.weight" in wmap
    assert len(set(wmap.values())) >= 2
    for shard in sorted(set(wmap.values())):
        with safe_open(str(tiny_snapshot / shard), framework="pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_projection_weights_are_large(tiny_snapshot):
    """std around 0.2 on the projections, so every mixer shows in whole-model comparisons."""
    from safetensors import safe_open

    wmap = json.loads((tiny_snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    for key in (
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.language_model.layers.3.self_attn.q_proj.weight",
    ):
        with safe_open(str(tiny_snapshot / wmap[key]), framework="pt") as f:
            assert 0.15 < float(f.get_tensor(key).float().std()) < 0.25


def test_loads_strictly_into_stock_classes(tiny_snapshot):
    """Every tensor but mtp.* fills Qwen3_5ForConditionalGeneration exactly: no missing, no unexpected."""
    from safetensors import safe_open
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    cfg = AutoConfig.from_pretrained(str(tiny_snapshot))
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration(cfg)
    wmap = json.loads((tiny_snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    state = {}
    for k, shard in wmap.items():
        if not k.startswith("mtp."):
            with safe_open(str(tiny_snapshot / shard), framework="pt") as f:
                state[k] = f.get_tensor(k)
    result = model.load_state_dict(state, strict=True, assign=True)
    assert not result.missing_keys and not result.unexpected_keys


def test_hugging_face_loader_reads_it(tiny_snapshot):
    """transformers' own from_pretrained reads the snapshot, ignoring only mtp.*."""
    from transformers import Qwen3_5ForConditionalGeneration

    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(str(tiny_snapshot), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert all(k.startswith("mtp.") for k in info["unexpected_keys"])


def test_tokenizer_round_trips(tiny_snapshot):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_snapshot))
    text = "Is the state in order? Yes: 42 items, naïve café."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # the merges apply: it is a BPE, not a byte map
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok("<|im_start|>hi<|im_end|>")["input_ids"][-1] == end
    assert (
        max(tok.get_vocab().values())
        < json.loads((tiny_snapshot / "config.json").read_text())["text_config"]["vocab_size"]
    )


def test_every_mixer_moves_the_hidden_state(tiny_snapshot):
    """Each GatedDeltaNet and attention layer adds at least 5% of the residual's norm."""
    from scripts.qwen35 import text_stack

    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    x = torch.randn(1, 48, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    residual, shares = {}, {}

    def keep_residual(i):
        def hook(mod, args, kwargs):
            residual[i] = (args[0] if args else kwargs["hidden_states"]).norm()

        return hook

    def share_of_residual(i):
        def hook(mod, args, kwargs, out):
            shares[i] = float((out[0] if isinstance(out, tuple) else out).norm() / residual[i])

        return hook

    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(keep_residual(i), with_kwargs=True)
        mixer = layer.linear_attn if layer.block_type == "linear_attention" else layer.self_attn
        mixer.register_forward_hook(share_of_residual(i), with_kwargs=True)
    model(inputs_embeds=x, use_cache=False)
    assert len(shares) == len(model.layers)
    assert min(shares.values()) > 0.05, shares


@pytest.mark.parametrize("name", ["model.language_model.layers.0.linear_attn.A_log", "lm_head.weight"])
def test_seed_depends_on_name_only(name):
    """A tensor's values come from its name: the draw is independent of the others."""
    shape = (4,) if name.endswith("A_log") else (8, 8)
    a, b = tiny_checkpoint._draw(name, shape), tiny_checkpoint._draw(name, shape)
    assert torch.equal(a, b)
    assert not torch.equal(a, tiny_checkpoint._draw(name + "x", shape))
    assert hashlib.sha256(a.numpy().tobytes()).hexdigest() == hashlib.sha256(b.numpy().tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# What the weights do, measured through stock transformers: memory, massive activations, fp32 sanity

WINDOW = 64  # the pipeline's chunk: state that survives it is what a kernel dropping the carry loses
KEPT = 0.1  # a head "keeps memory" when >= 10% of its state survives a window


def record_embeds(snapshot, n: int = 200, seed: int = 11) -> tuple[list[int], torch.Tensor]:
    """A record of n tokens of held-out text, as the checks build theirs (massive-activation tokens
    included: the byte-level space is one), and its host embeds."""
    from scripts.checks import record_text
    from scripts.qwen35.host import Host

    host = Host(snapshot)
    ids = record_text.HeldOutText(host).ids(n, seed)
    return ids, host.record(ids, n)["embeds"]


def chunk_survival(model, embeds: torch.Tensor, window: int = WINDOW) -> dict[int, torch.Tensor]:
    """{layer: [heads]}: per GatedDeltaNet value head, exp(sum of g over `window` consecutive tokens),
    the median over every window of the record, g as the stock layer hands it to its chunk kernel."""
    gs, layers = (
        {},
        {i: layer.linear_attn for i, layer in enumerate(model.layers) if layer.block_type == "linear_attention"},
    )
    kernels = {i: m.chunk_gated_delta_rule for i, m in layers.items()}  # an instance attribute
    for i, m in layers.items():

        def capture(*args, _i=i, **kwargs):
            gs[_i] = kwargs["g"].detach().double()[0]  # [L, H]
            return kernels[_i](*args, **kwargs)

        m.chunk_gated_delta_rule = capture
    try:
        with torch.no_grad():
            model(inputs_embeds=embeds, use_cache=False)
    finally:
        for i, m in layers.items():
            m.chunk_gated_delta_rule = kernels[i]
    assert set(gs) == set(layers)
    out = {}
    for i, g in gs.items():
        cum = torch.cat([torch.zeros(1, g.shape[1], dtype=g.dtype), g.cumsum(0)])
        out[i] = (cum[window:] - cum[:-window]).exp().median(0).values
    return out


def heads_keeping_memory(survival: dict[int, torch.Tensor]) -> dict[int, float]:
    """{layer: share of heads keeping >= KEPT of their state over a window}."""
    return {i: float((s >= KEPT).double().mean()) for i, s in survival.items()}


def test_gated_deltanets_keep_memory_across_a_chunk(tiny_snapshot):
    """Measured, not nominal: in every GatedDeltaNet at least half the heads keep >= 10% of their
    state over 64 tokens, so a kernel that drops the state carried between chunks shows."""
    from scripts.qwen35 import text_stack

    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    _, embeds = record_embeds(tiny_snapshot)
    survival = chunk_survival(model, embeds)
    assert len(survival) == sum(layer.block_type == "linear_attention" for layer in model.layers)
    shares = heads_keeping_memory(survival)
    assert min(shares.values()) >= 0.5, {i: [f"{v:.2g}" for v in s.tolist()] for i, s in survival.items()}
    for s in survival.values():  # the memory heads are the even ones, as drawn
        assert bool((s[0::2] >= KEPT).all()), s


def _old_draw(name: str, shape) -> torch.Tensor:
    """The draw the checkpoint had before its memory design: A ~ U(0, 16), dt_bias ~ 1 + 0.1 N,
    in_proj_a at the projections' std 0.2."""
    gen = tiny_checkpoint._generator(name)
    if name.endswith("A_log"):
        return torch.rand(shape, generator=gen).mul(16.0).clamp_min(1e-3).log()
    if name.endswith("dt_bias"):
        return 1.0 + tiny_checkpoint.NORM_STD * torch.randn(shape, generator=gen)
    return tiny_checkpoint.PROJECTION_STD * torch.randn(shape, generator=gen)


@pytest.mark.parametrize("fault", ["old_draw", "dt_bias_up_10"])
def test_memory_measurement_sees_fast_decay(tiny_snapshot, fault):
    """The control: the same measurement on decays that forget within a chunk reports fewer than half
    the heads keeping memory, in every layer."""
    from scripts.qwen35 import text_stack

    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    for i, layer in enumerate(model.layers):
        if layer.block_type != "linear_attention":
            continue
        m, prefix = layer.linear_attn, f"model.language_model.layers.{i}.linear_attn"
        with torch.no_grad():
            if fault == "old_draw":
                for leaf, param in (
                    ("A_log", m.A_log),
                    ("dt_bias", m.dt_bias),
                    ("in_proj_a.weight", m.in_proj_a.weight),
                ):
                    param.copy_(_old_draw(f"{prefix}.{leaf}", tuple(param.shape)).to(torch.bfloat16))
            else:
                m.dt_bias.add_(10.0)
    _, embeds = record_embeds(tiny_snapshot)
    shares = heads_keeping_memory(chunk_survival(model, embeds))
    assert max(shares.values()) < 0.5, shares


# Massive activations: the chosen channels over the median |value| of the others, at massive-activation
# tokens, entering every layer. The draw holds them >= 50x (tests/test_train_tiny.py). Trained (their
# embed_tokens entries and the residual writers' rows held as drawn), they fade through the layers as the
# rest of the stream grows: over 24 held-out windows of 200 tokens at least 2100x, 159x, 63x, 50x entering
# layers 0-3 and 10.0x entering the last (docs/trained-checkpoint.md). What the trained checkpoint is held
# to is what per-position errors need, positions of very different scale: the massive positions' norm at
# least POSITION_SCALE_TRAINED x the others' entering every layer (measured at least 3.1x), their channels
# at least MASSIVE_OVER_REST_TRAINED x the rest.
MASSIVE_OVER_REST_DRAWN = 50.0
MASSIVE_OVER_REST_TRAINED = 8.0
POSITION_SCALE_TRAINED = 2.5


def massive_ratios(states, ids: list[int], config) -> tuple[list[float], float, list[float]]:
    """([per layer: the median ratio at massive-activation tokens], the largest ratio at any other token
    entering the first layer, [per layer: the massive positions' median norm over the others']) for the
    hidden states entering each layer (`states`: [1, n, H] each)."""
    tokens = set(tiny_checkpoint.massive_tokens(config.vocab_size))
    massive = torch.tensor([i in tokens for i in ids])
    assert 5 <= int(massive.sum()) < len(ids) // 2  # some positions, not most
    channels = tiny_checkpoint.massive_channels(config.hidden_size)
    others = [c for c in range(config.hidden_size) if c not in channels]
    medians, ordinary, scales = [], 0.0, []
    for layer in range(config.num_hidden_layers):
        hidden = states[layer][0]
        ratio = hidden[:, channels].abs() / hidden[:, others].abs().median(-1).values[:, None]  # [n, 3]
        medians.append(float(ratio[massive].median()))
        norms = hidden.norm(dim=-1)
        scales.append(float(norms[massive].median() / norms[~massive].median()))
        if layer == 0:
            ordinary = float(ratio[~massive].max())
    return medians, ordinary, scales


def test_massive_activations_in_the_residual_stream(tiny_snapshot):
    """At massive-activation tokens of held-out text the 3 chosen channels of the residual stream are
    >= 8x the median |value| of the other channels, and those positions' norm >= 2.5x the others', entering
    every layer; entering the first, at every other token the channels are ordinary."""
    from scripts.qwen35 import text_stack

    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    ids, embeds = record_embeds(tiny_snapshot)
    with torch.no_grad():
        states = model(inputs_embeds=embeds, use_cache=False, output_hidden_states=True).hidden_states
    medians, ordinary, scales = massive_ratios(states, ids, model.config)
    assert min(medians) >= MASSIVE_OVER_REST_TRAINED, medians
    assert min(scales) >= POSITION_SCALE_TRAINED, scales
    assert ordinary < 10.0, ordinary


def test_massive_activation_measurement_sees_ordinary_rows(tiny_snapshot):
    """The control: with the massive entries of embed_tokens set to ordinary values the same measurement
    finds no massive activations (the channels under the bound, the positions of one scale, in every layer)."""
    from scripts.qwen35 import text_stack

    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    ids, embeds = record_embeds(tiny_snapshot)
    tokens = set(tiny_checkpoint.massive_tokens(model.config.vocab_size))
    rows = torch.tensor([t for t, i in enumerate(ids) if i in tokens])
    cols = torch.tensor(tiny_checkpoint.massive_channels(model.config.hidden_size))
    embeds[0, rows[:, None], cols[None, :]] = embeds[0, rows[:, None], cols[None, :]].sign()
    with torch.no_grad():
        states = model(inputs_embeds=embeds, use_cache=False, output_hidden_states=True).hidden_states
    medians, _, scales = massive_ratios(states, ids, model.config)
    assert max(medians) < MASSIVE_OVER_REST_TRAINED, medians
    assert max(scales) < POSITION_SCALE_TRAINED, scales


def test_fp32_stack_is_finite_and_close_to_float64(tiny_snapshot):
    """The stock fp32 stack on a 200-token record (massive activations and long memory included)
    is finite and within 1e-3 of the same model in float64."""
    from scripts.checks.model_check import in_float64
    from scripts.qwen35 import text_stack

    model, _ = text_stack.load_text_stack(tiny_snapshot, progress=False)
    _, embeds = record_embeds(tiny_snapshot)
    with torch.no_grad():
        fp32 = model(inputs_embeds=embeds, use_cache=False).last_hidden_state
        exact = in_float64(model)(inputs_embeds=embeds.double(), use_cache=False).last_hidden_state
    assert bool(torch.isfinite(fp32).all())
    err = float((fp32.double() - exact).abs().max() / exact.abs().max())
    assert err < 1e-3, err


def test_decay_pairs_give_the_nominal_rates(tiny_snapshot):
    """As stored (bf16), each GatedDeltaNet's A_log and dt_bias pair up to a per-token rate
    A x softplus(dt_bias) in the memory range on even heads and the fast range on odd ones."""
    from safetensors import safe_open

    wmap = json.loads((tiny_snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    prefixes = sorted(k[: -len(".A_log")] for k in wmap if k.endswith(".A_log"))
    assert len(prefixes) == tiny_checkpoint.TEXT_CONFIG["layer_types"].count("linear_attention")
    for prefix in prefixes:
        got = {}
        for leaf in ("A_log", "dt_bias"):
            with safe_open(str(tiny_snapshot / wmap[f"{prefix}.{leaf}"]), framework="pt") as f:
                got[leaf] = f.get_tensor(f"{prefix}.{leaf}").double()
        a = got["A_log"].exp()
        assert bool(((a > 0.97 * tiny_checkpoint.A_RANGE[0]) & (a < 1.03 * tiny_checkpoint.A_RANGE[1])).all()), a
        rate = a * torch.nn.functional.softplus(got["dt_bias"])
        for heads, (lo, hi) in ((rate[0::2], tiny_checkpoint.MEMORY_RATE), (rate[1::2], tiny_checkpoint.FAST_RATE)):
            assert bool(((heads > 0.9 * lo) & (heads < 1.1 * hi)).all()), (prefix, rate)
