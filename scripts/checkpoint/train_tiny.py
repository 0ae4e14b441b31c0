"""Train the embedded checkpoint on the corpus's train part (make train-tiny), deterministically.

It starts from the drawn checkpoint (scripts/checkpoint/tiny_checkpoint.py) and trains every text-stack
tensor and lm_head with AdamW on next-token cross-entropy, but for what verification needs kept as drawn:
- each GatedDeltaNet's decay (A_log, dt_bias and in_proj_a, the data-dependent gate): trained freely,
  the gate learns to speed the decay on most text and half the heads lose their memory within a chunk,
  so a kernel that drops the state carried between chunks would no longer show;
- the massive activations: their entries of embed_tokens, and the rows of every residual writer
  (o_proj, out_proj, down_proj) for their channels: trained freely, the layers learn to write against
  them and the rest of the stream grows, down to ~11x the rest entering the last layer.
Batches are windows of the token stream at offsets drawn from one seeded generator; the thread count is
fixed, so the same machine kind gives the same bytes, and `--check` retrains and names the first tensor
that differs from the committed one.

Writes scripts/checkpoint/trained/: tensors.safetensors (the trained tensors in bf16), training.json
(steps, tokens, seconds, the loss curve) and loss.svg.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
import time
from pathlib import Path

import torch

from scripts.checkpoint import corpus, tiny_checkpoint
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record

FOLDER = Path(__file__).with_name("trained")
TENSORS = tiny_checkpoint.TRAINED_TENSORS
RECORD = FOLDER / "training.json"
CURVE = FOLDER / "loss.svg"
SEED = 51
THREADS = 2
STEPS = 1100
BATCH = 8
WINDOW = 384  # tokens a training window scores: past the longest graph (a pair's P + S = 320)
LR = 2e-3
WARMUP = 50
BETAS = (0.9, 0.95)
CLIP = 1.0
FROZEN = (".A_log", ".dt_bias", ".in_proj_a.weight")
RESIDUAL_WRITERS = (".o_proj.weight", ".out_proj.weight", ".down_proj.weight")


@dataclasses.dataclass(frozen=True)
class TrainingRecord(Record):
    seed: int
    threads: int
    steps: int
    batch: int
    window: int
    learning_rate: float
    tokens: int  # tokens scored over the whole training
    train_stream_tokens: int
    corpus_sha256: str  # of corpus.json
    seconds: float
    loss: list[float]  # mean cross-entropy (nats per token) of each step


def tokenizer():
    """The embedded checkpoint's own tokenizer (the one its snapshot ships)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tiny_checkpoint.tokenizer_files()["tokenizer.json"].decode())


def token_stream(texts: list[str]) -> torch.Tensor:
    """The files' tokens, one stream, the separator token between files (corpus.token_stream)."""
    tok = tokenizer()
    ids = corpus.token_stream(lambda t: tok.encode(t).ids, tok.token_to_id(corpus.SEPARATOR), texts)
    return torch.tensor(ids, dtype=torch.long)


def drawn_model():
    """The drawn checkpoint's text stack and lm_head, in float32, as one CausalLM-shaped pair."""
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    cfg = Qwen3_5TextConfig(**tiny_checkpoint.TEXT_CONFIG)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    stack = Qwen3_5TextModel(cfg).float()
    head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    drawn = tiny_checkpoint.drawn_tensors()
    prefix = "model.language_model."
    stack.load_state_dict({k[len(prefix) :]: v.float() for k, v in drawn.items() if k.startswith(prefix)}, strict=True)
    head.weight.data.copy_(drawn["lm_head.weight"].float())
    return stack, head


def trained_keys(stack, head) -> dict[str, torch.nn.Parameter]:
    """checkpoint key -> parameter, for everything the training updates."""
    out = {f"model.language_model.{k}": p for k, p in stack.named_parameters() if not k.endswith(FROZEN)}
    out["lm_head.weight"] = head.weight
    return out


def held_entries(stack) -> dict[str, torch.Tensor]:
    """checkpoint key -> a 0/1 mask of the entries training leaves as drawn (0: held), for the tensors that
    carry the massive activations: embed_tokens at the massive tokens' channels, and every residual
    writer's rows of those channels."""
    cfg = stack.config
    channels = torch.tensor(tiny_checkpoint.massive_channels(cfg.hidden_size))
    rows = torch.tensor(tiny_checkpoint.massive_tokens(cfg.vocab_size))
    out = {}
    for k, p in stack.named_parameters():
        if k == "embed_tokens.weight":
            mask = torch.ones_like(p)
            mask[rows[:, None], channels[None, :]] = 0.0
        elif k.endswith(RESIDUAL_WRITERS):
            mask = torch.ones_like(p)
            mask[channels] = 0.0
        else:
            continue
        out[f"model.language_model.{k}"] = mask
    return out


def trained_model():
    """The drawn model with the committed trained tensors in place: what the training produced."""
    from safetensors.torch import load_file

    if not TENSORS.is_file():
        raise ClefError(f"no trained tensors at {TENSORS}: run make train-tiny")
    stack, head = drawn_model()
    trained = load_file(str(TENSORS))
    params = trained_keys(stack, head)
    odd = sorted(set(trained) ^ set(params))
    if odd:
        raise ClefError(
            f"{TENSORS}: {odd[0]} is not both trained and stored ({len(odd)} keys differ); rerun make train-tiny"
        )
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(trained[k].float())
    return stack, head


def lr_at(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    return LR * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def train(steps: int = STEPS, progress: bool = True) -> tuple[dict[str, torch.Tensor], TrainingRecord]:
    """The trained tensors (bf16, keyed as in the snapshot) and the record of the run."""
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    c = corpus.checked()  # before any work: a missing or changed corpus file is one line
    stream = token_stream(corpus.text(c, "train"))
    stack, head = drawn_model()
    params = trained_keys(stack, head)
    held = held_entries(stack)
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    losses, start = [], time.monotonic()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        offsets = torch.randint(0, len(stream) - WINDOW - 1, (BATCH,), generator=gen)
        batch = torch.stack([stream[o : o + WINDOW + 1] for o in offsets.tolist()])
        hidden = stack(input_ids=batch[:, :-1], use_cache=False).last_hidden_state
        loss = torch.nn.functional.cross_entropy(head(hidden).flatten(0, 1), batch[:, 1:].flatten())
        if not torch.isfinite(loss):
            raise ClefError(f"training diverged at step {step}: loss {float(loss)}")
        loss.backward()
        for k, mask in held.items():  # a zero gradient: AdamW (no weight decay) leaves the entry as drawn
            params[k].grad.mul_(mask)
        torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 5))
        if progress and (step % 50 == 0 or step == steps - 1):
            print(
                f"train-tiny: step {step}/{steps} loss {losses[-1]:.4f} ({time.monotonic() - start:.0f} s)", flush=True
            )
    out = {k: p.detach().to(torch.bfloat16).contiguous() for k, p in sorted(params.items())}
    record = TrainingRecord(
        seed=SEED,
        threads=THREADS,
        steps=steps,
        batch=BATCH,
        window=WINDOW,
        learning_rate=LR,
        tokens=steps * BATCH * WINDOW,
        train_stream_tokens=len(stream),
        corpus_sha256=hashlib.sha256(corpus.MANIFEST.read_bytes()).hexdigest(),
        seconds=round(time.monotonic() - start, 1),
        loss=losses,
    )
    return out, record


def differing(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    """The keys whose tensors differ between two trainings (missing on either side included), sorted."""
    keys = sorted(set(got) | set(want))
    return [k for k in keys if k not in got or k not in want or not torch.equal(got[k], want[k])]


def loss_curve(record: TrainingRecord) -> str:
    from scripts.pipeline import pictures

    every = max(1, len(record.loss) // 200)
    data = [{"step": i, "loss": v} for i, v in enumerate(record.loss) if i % every == 0]
    return pictures.svg(
        {
            "title": f"train-tiny: cross-entropy per token ({record.steps} steps, {record.tokens:,} tokens)",
            "width": pictures.WIDTH,
            "height": 220,
            "data": {"values": data},
            "mark": "line",
            "encoding": {
                "x": {"field": "step", "type": "quantitative"},
                "y": {"field": "loss", "type": "quantitative", "title": "nats per token"},
            },
        }
    )


def main(argv: list[str]) -> None:
    from safetensors.torch import load_file, save

    from scripts.pipeline import atomic

    check = "--check" in argv
    if check and not TENSORS.is_file():
        raise ClefError(f"train-tiny --check: no {TENSORS} to compare with; run make train-tiny first")
    tensors, record = train()
    if check:
        diff = differing(tensors, load_file(str(TENSORS)))
        if diff:
            raise ClefError(f"train-tiny --check: {len(diff)} tensors differ from {TENSORS}, first {diff[0]}")
        print(f"train-tiny --check: all {len(tensors)} tensors identical to {TENSORS}")
        return
    FOLDER.mkdir(exist_ok=True)
    atomic.write_bytes(TENSORS, save(tensors, metadata={"format": "pt"}))
    atomic.write_json(RECORD, record.to_json())
    atomic.write_text(CURVE, loss_curve(record))
    print(
        f"train-tiny: {len(tensors)} tensors -> {TENSORS} in {record.seconds:.0f} s, final loss {record.loss[-1]:.4f}"
    )


if __name__ == "__main__":
    from scripts.pipeline.errors import run_command

    run_command(lambda: main(sys.argv[1:]))
