"""The embedded checkpoint: deterministic, clef-flash's structure, loadable by stock transformers."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from scripts import fetch, snapshot, tiny_checkpoint


def test_same_bytes_every_time(tiny_cache, tmp_path):
    """Two writes give the same revision and the same sha256 for every file."""
    _, rec = tiny_cache
    repo, revision = fetch.write_tiny(tmp_path / "hf")
    again = snapshot.record(snapshot.snapshot_dir(tmp_path / "hf", repo, revision), "tiny", repo, revision, root=tmp_path)
    assert revision == rec["revision"]
    assert again["files"] == rec["files"]
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
    assert [i for i, t in enumerate(text.layer_types) if t == "full_attention"] == list(range(3, text.num_hidden_layers, 4))
    assert text.linear_num_value_heads == 2 * text.linear_num_key_heads
    assert text.num_attention_heads % text.num_key_value_heads == 0 and text.num_key_value_heads < text.num_attention_heads
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
    for key in ("model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
                "model.language_model.layers.3.self_attn.q_proj.weight"):
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
    assert max(tok.get_vocab().values()) < json.loads((tiny_snapshot / "config.json").read_text())["text_config"]["vocab_size"]


def test_every_mixer_moves_the_hidden_state(tiny_snapshot):
    """Each GatedDeltaNet and attention layer adds at least 5% of the residual's norm."""
    from scripts import text_stack

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
