"""The embedded default checkpoint: clef-flash's structure at toy sizes, trained, the same bytes everywhere.

No machine here reaches the Hugging Face hub, so the pipeline and the tests run on this checkpoint.
It has what the real snapshot has, so downstream code cannot tell them apart by layout:
- a `Qwen3_5ForConditionalGeneration` config whose text stack keeps clef-flash's shape: full
  attention every 4th layer, twice as many GatedDeltaNet value heads as key heads, GQA attention
  with the output gate, partial rotary 0.25 with interleaved M-RoPE, untied lm_head;
- bf16 safetensors in two shards with an index, `model.visual.*` and `mtp.*` tensors included
  (the text-stack loader must skip them), and a byte-level BPE tokenizer.
Its text stack and lm_head are trained (scripts/checkpoint/train_tiny.py, committed under
trained/): `tensors()` is the draw below with the trained tensors in place. The draw is where
training starts, and it is shaped so that verification has something to see; training keeps it:
- projections get std 0.2, not the 0.02 of initializer_range: at 0.02 the GatedDeltaNet outputs are
  too small to show in whole-model comparisons;
- memory: in every GatedDeltaNet the even value heads decay slowly (nominal per-token rate
  A x softplus(dt_bias) in [1e-4, 2e-2], as trained Qwen3.5 heads do) and the odd heads fast
  ([0.05, 2]), so state survives many 64-token chunks and a kernel that drops the state carried
  between chunks shows; in_proj_a is small, so the data-dependent gate modulates the decay only.
  Training leaves A_log and dt_bias as drawn;
- massive activations: in the embed_tokens rows of every 16th token id, 3 fixed hidden channels
  carry values that stay far above the rest of the residual stream through every layer, as in
  trained Qwen models, so per-position errors have positions of very different scale to tell
  apart (drawn: >= 50x entering every layer; trained: weaker in the last layers, see
  docs/trained-checkpoint.md).
Each tensor comes from a seed derived from its name (a layer's A_log and dt_bias, drawn as a pair,
from the layer's name prefix), so adding a tensor changes no other.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from pathlib import Path

import torch

from scripts.pipeline.mappings import ForeignJson, Shapes, Tensors

REPO = "clef-litert/clef-flash-tiny"
# The trained text stack and lm_head (make train-tiny writes it; the snapshot reads it).
TRAINED_TENSORS = Path(__file__).with_name("trained") / "tensors.safetensors"
SEED = 20260
PROJECTION_STD = 0.2
NORM_STD = 0.1  # Qwen3_5RMSNorm scales by (1 + weight): weights near 0, not 1
EMBED_STD = 1.0
VISION_STD = 0.02  # the vision tower is only carried, never run: its values do not matter

# GatedDeltaNet decay. The per-token log-decay is g = -A x softplus(a + dt_bias), a = in_proj_a(x).
# Per layer, value head h gets a nominal rate r = A x softplus(dt_bias), drawn log-uniform in a range
# by its parity: even heads remember (exp(-64 r) >= 0.28 of the state survives a 64-token chunk),
# odd heads forget within one (exp(-64 r) <= 0.04). A is drawn in the stock init range; dt_bias then
# solves softplus(dt_bias) = r / A.
MEMORY_RATE = (1e-4, 2e-2)  # even heads: trained Qwen3.5 heads keep memory for hundreds of tokens
FAST_RATE = (0.05, 2.0)  # odd heads
A_RANGE = (1.0, 16.0)  # A ~ U(1, 16), transformers' init range (without its near-0 end)
# in_proj_a std = IN_PROJ_A_GAIN / sqrt(fan_in): on unit-scale (normed) inputs a varies by ~+-0.3, so
# the data-dependent gate scales the decay by ~exp(+-0.3) without erasing memory; at the projections'
# std 0.2 (a ~ +-2.3 at fan-in 128) it would swing the rate ~10x either way and wipe the slow heads.
IN_PROJ_A_GAIN = 0.3

# Massive activations: MASSIVE_CHANNELS hidden channels (a seeded permutation's first ones) of the
# embed_tokens rows of every token id divisible by MASSIVE_TOKEN_EVERY get random sign and magnitude
# U(MASSIVE_SCALE) x EMBED_STD; every other value stays as drawn.
MASSIVE_CHANNELS = 3
MASSIVE_TOKEN_EVERY = 16
MASSIVE_SCALE = (1000.0, 2000.0)  # at 50-100 they fall to ~3-9x the rest past the first layer

# clef-flash (Qwen3.5-9B) shape at toy sizes; the comment gives the real value where it differs.
TEXT_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 320,  # 248320
    "hidden_size": 128,  # 4096
    "intermediate_size": 256,  # 12288
    "num_hidden_layers": 8,  # 32
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "full_attention_interval": 4,
    "num_attention_heads": 4,  # 16
    "num_key_value_heads": 1,  # 4: the same 4:1 grouping
    "head_dim": 64,  # 256
    "attn_output_gate": True,
    "linear_num_key_heads": 2,  # 16
    "linear_num_value_heads": 4,  # 32: each q/k head serves 2 value heads
    "linear_key_head_dim": 32,  # 128
    "linear_value_head_dim": 32,  # 128
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,  # 262144
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,  # rotary width 64 x 0.25 = 16: 8 frequencies
        "mrope_section": [3, 3, 2],  # [11, 11, 10]: the 8 frequencies split T/H/W
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "dtype": "bfloat16",
}

VISION_CONFIG = {
    "model_type": "qwen3_5_vision",
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": TEXT_CONFIG["hidden_size"],
    "num_position_embeddings": 16,
}

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# A few byte-level merges so the tokenizer is a real BPE, not a byte map ("Ġ" is the byte-level space).
MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "s"),
    ("r", "e"),
    ("a", "t"),
    ("e", "n"),
    ("Ġ", "o"),
    ("Ġ", "w"),
    ("o", "r"),
    ("i", "s"),
    ("Ġ", "c"),
]
SHARDS = 2

FileBytes = dict[str, bytes]
"""A snapshot file's name -> its bytes."""


def mtp_shapes(hidden: int) -> Shapes:
    """A few of the multi-token-prediction head's tensors: present in the snapshot, never loaded."""
    return {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.norm.weight": (hidden,),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
    }


def config(text_config: ForeignJson = TEXT_CONFIG) -> ForeignJson:
    """config.json for a text stack `text_config` (the tiny one by default) with the toy vision tower."""
    n = len(SPECIAL_TOKENS)
    first_special = 256 + len(MERGES)
    ids = {tok: first_special + i for i, tok in enumerate(SPECIAL_TOKENS)}
    assert first_special + n <= text_config["vocab_size"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {**text_config, "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]},
        "vision_config": {**VISION_CONFIG, "out_hidden_size": text_config["hidden_size"]},
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "transformers_version": "5.14.1",
    }


def byte_alphabet() -> list[str]:
    """Byte-level BPE's printable stand-in for each byte 0..255 (printable bytes map to themselves,
    the rest to code points from 256 upward, in byte order)."""
    printable = (
        set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    )
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tokenizer_files() -> FileBytes:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(BPE(vocab=vocab, merges=MERGES, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    # Qwen's pre-tokenizer split (contractions, letter runs, single digits, punctuation, spaces).
    split = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "bos_token": None,
        "add_prefix_space": False,
        "model_max_length": TEXT_CONFIG["max_position_embeddings"],
    }
    return {
        "tokenizer.json": tok.to_str(pretty=True).encode() + b"\n",
        "tokenizer_config.json": json_bytes(tokenizer_config),
    }


def json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _generator(name: str) -> torch.Generator:
    """A generator seeded from `name` alone (a tensor's key, or a layer's prefix)."""
    return torch.Generator().manual_seed(SEED * 2**32 + zlib.crc32(name.encode()))


def decay_parameters(prefix: str, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log, dt_bias) [heads] float32 of the GatedDeltaNet `prefix` (e.g.
    "model.language_model.layers.0.linear_attn"): one generator for both, so they pair up.
    Even heads get a memory rate, odd heads a fast one (see MEMORY_RATE)."""
    gen = _generator(prefix)
    a = A_RANGE[0] + (A_RANGE[1] - A_RANGE[0]) * torch.rand(heads, generator=gen, dtype=torch.float64)
    u = torch.rand(heads, generator=gen, dtype=torch.float64)
    memory = torch.arange(heads) % 2 == 0
    lo = torch.where(memory, math.log(MEMORY_RATE[0]), math.log(FAST_RATE[0]))
    hi = torch.where(memory, math.log(MEMORY_RATE[1]), math.log(FAST_RATE[1]))
    rate = torch.exp(lo + u * (hi - lo))
    dt = rate / a
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # the inverse of softplus, exact for small dt too
    return a.log().float(), dt_bias.float()


def massive_channels(hidden: int) -> list[int]:
    """The hidden channels that carry the massive activations, from a seeded permutation."""
    return sorted(torch.randperm(hidden, generator=_generator("massive_channels"))[:MASSIVE_CHANNELS].tolist())


def massive_tokens(vocab: int) -> list[int]:
    """The token ids whose embed_tokens rows carry the massive activations."""
    return list(range(0, vocab, MASSIVE_TOKEN_EVERY))


def _draw(name: str, shape: tuple[int, ...], projection_std: float = PROJECTION_STD) -> torch.Tensor:
    """A float32 tensor for checkpoint key `name`, from a seed derived from the name alone (A_log and
    dt_bias: from their layer's prefix). `projection_std` applies to the projections but in_proj_a."""
    gen = _generator(name)
    randn = lambda: torch.randn(shape, generator=gen)  # noqa: E731
    leaf = name.rsplit(".", 2)
    if name.startswith("model.visual."):
        return (
            torch.ones(shape)
            if name.endswith("norm1.weight") or name.endswith("norm2.weight")
            else VISION_STD * randn()
        )
    if name.endswith(".A_log") or name.endswith(".dt_bias"):
        prefix, leaf_name = name.rsplit(".", 1)
        return decay_parameters(prefix, shape[0])[0 if leaf_name == "A_log" else 1]
    if name.endswith("linear_attn.in_proj_a.weight"):
        return IN_PROJ_A_GAIN / math.sqrt(shape[1]) * randn()
    if name.endswith("linear_attn.norm.weight"):  # the gated norm is a plain weight: centred on 1
        return 1.0 + NORM_STD * randn()
    if leaf[-2].endswith("norm") or leaf[-2].endswith("layernorm"):
        return NORM_STD * randn()
    if name.endswith("embed_tokens.weight"):
        table = EMBED_STD * randn()
        rows = torch.tensor(massive_tokens(shape[0]))
        cols = torch.tensor(massive_channels(shape[1]))
        size = (len(rows), len(cols))
        sign = torch.where(torch.rand(size, generator=gen) < 0.5, -1.0, 1.0)
        magnitude = MASSIVE_SCALE[0] + (MASSIVE_SCALE[1] - MASSIVE_SCALE[0]) * torch.rand(size, generator=gen)
        table[rows[:, None], cols[None, :]] = sign * magnitude * EMBED_STD
        return table
    return projection_std * randn()


def shapes(cfg: ForeignJson) -> Shapes:
    """Every checkpoint key of config `cfg` with its shape (read off a model built on the meta device)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**cfg))
    out = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out.update(mtp_shapes(cfg["text_config"]["hidden_size"]))
    return out


def drawn_tensors() -> Tensors:
    """Every checkpoint tensor as drawn, in bf16, keyed as in the real snapshot, in sorted key order:
    where training starts."""
    sizes = shapes(config())
    return {k: _draw(k, sizes[k]).to(torch.bfloat16).contiguous() for k in sorted(sizes)}


def tensors() -> Tensors:
    """Every checkpoint tensor in bf16, sorted by key: the draw with the committed trained tensors in
    place (same keys, shapes and dtype, or a one-line refusal naming the first that differs)."""
    from safetensors.torch import load_file

    from scripts.pipeline.errors import ClefError

    out = drawn_tensors()
    if not TRAINED_TENSORS.is_file():
        raise ClefError(f"no trained tensors at {TRAINED_TENSORS}: run make train-tiny")
    for key, t in sorted(load_file(str(TRAINED_TENSORS)).items()):
        if key not in out or out[key].shape != t.shape or t.dtype != torch.bfloat16:
            raise ClefError(f"{TRAINED_TENSORS}: {key} is not a bf16 tensor of the drawn checkpoint's shape")
        out[key] = t.contiguous()
    return out


def shard_name(i: int) -> str:
    return f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"


def files() -> FileBytes:
    """name -> bytes of every snapshot file."""
    from safetensors.torch import save

    weights = tensors()
    names = list(weights)
    # Shard 1 holds the vision tower and the first half of the text stack, shard 2 the rest.
    cut = len(names) // 2
    groups = [names[:cut], names[cut:]]
    out = {"config.json": json_bytes(config()), **tokenizer_files()}
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        out[shard_name(i)] = save({k: weights[k] for k in group}, metadata={"format": "pt"})
        for k in group:
            weight_map[k] = shard_name(i)
            total += weights[k].numel() * weights[k].element_size()
    out["model.safetensors.index.json"] = json_bytes({"metadata": {"total_size": total}, "weight_map": weight_map})
    return out


def revision(content: FileBytes) -> str:
    """A 40-hex id named by the content itself: the same files, the same revision, on every machine."""
    return revision_of_digests({name: hashlib.sha256(data).hexdigest() for name, data in content.items()})


def revision_of_digests(digests: dict[str, str]) -> str:
    """The revision of a snapshot given each file's sha256: sha1 of the sorted name/digest listing."""
    listing = "".join(f"{name}\0{digests[name]}\n" for name in sorted(digests))
    return hashlib.sha1(listing.encode()).hexdigest()
