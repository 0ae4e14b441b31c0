"""The kernel form grammar: which GatedDeltaNet kernel a graph is built with, as a short string.

A form is a `+`-joined list of parts (params.yaml `form`, `verify_kernel.forms`):
  R<n>    chunk n (a power of two, 16..128) with a loop-free in-chunk triangular inverse
  loop    chunk 64 with the stock row-by-row inverse (the reference; ~1,000 graph ops per layer)
  sp      softplus as max(x, 0) + log1p(exp(-|x|)), log1p by its atanh series: exact in fp32, no
          overflow in fp16, and no LOG(1 + y), which rounds a small y (a slow decay) away
  ec      every exp argument clamped to <= 0 instead of masking with -inf: no inf, no NaN
  dd      in-chunk decays as direct segment sums of g (matmuls with 0/1 constants): no CUMSUM
  cumsum  decays as differences of cumulative sums, the stock way (the default)
  vs<k>   v x 2^k at the kernel entry; output and recurrent state are exactly 2^k x stock
Canonical order is the order above; defaults (cumsum, vs0) are left out of the canonical string.
The kernel each form computes is scripts/layers/gated_delta.py's. No torch here: params.yaml is checked
(scripts/pipeline/params.py) before anything heavy is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scripts.pipeline.errors import ClefError

VALID_PARTS = "R<n> (n a power of two, 16..128) or loop; sp; ec; dd or cumsum; vs<k> (0 <= k <= 12)"
CHUNK_MIN, CHUNK_MAX = 16, 128
LOOP_CHUNK = 64  # the stock kernel's chunk
VS_MAX = 12


@dataclass(frozen=True)
class Form:
    chunk: int = LOOP_CHUNK
    loop: bool = True
    sp: bool = False
    ec: bool = False
    dd: bool = False
    vs: int = 0

    def __str__(self) -> str:
        parts = ["loop" if self.loop else f"R{self.chunk}"]
        parts += [name for name in ("sp", "ec", "dd") if getattr(self, name)]
        if self.vs:
            parts.append(f"vs{self.vs}")
        return "+".join(parts)

    @property
    def v_scale(self) -> float:
        return float(2**self.vs)


STOCK = Form()


def parse(text: str) -> Form:
    """`R64+sp+ec+dd+vs6` -> Form; anything unknown, repeated or conflicting is a one-line ClefError."""
    if not isinstance(text, str) or not text.strip():
        raise ClefError(f"form {text!r} is empty; valid parts: {VALID_PARTS}")
    fields: dict = {}

    def put(key, value, part):
        if key in fields:
            raise ClefError(
                f"form {text!r}: part {part!r} conflicts with or repeats an earlier part; valid parts: {VALID_PARTS}"
            )
        fields[key] = value

    for part in text.strip().split("+"):
        if m := re.fullmatch(r"R(\d+)", part):
            n = int(m.group(1))
            if n < CHUNK_MIN or n > CHUNK_MAX or n & (n - 1):
                raise ClefError(f"form {text!r}: chunk {n} is not a power of two from {CHUNK_MIN} to {CHUNK_MAX}")
            put("chunk", (n, False), part)
        elif part == "loop":
            put("chunk", (LOOP_CHUNK, True), part)
        elif part in ("sp", "ec"):
            put(part, True, part)
        elif part in ("dd", "cumsum"):
            put("decay", part == "dd", part)
        elif m := re.fullmatch(r"vs(\d+)", part):
            k = int(m.group(1))
            if k > VS_MAX:
                raise ClefError(f"form {text!r}: vs{k} is out of range 0..{VS_MAX}")
            put("vs", k, part)
        else:
            raise ClefError(f"form {text!r}: unknown part {part!r}; valid parts: {VALID_PARTS}")
    if "chunk" not in fields:
        raise ClefError(f"form {text!r} has no chunk part (R<n> or loop); valid parts: {VALID_PARTS}")
    chunk, loop = fields["chunk"]
    return Form(
        chunk=chunk,
        loop=loop,
        sp=fields.get("sp", False),
        ec=fields.get("ec", False),
        dd=fields.get("decay", False),
        vs=fields.get("vs", 0),
    )


def parse_canonical(text: str) -> Form:
    """A form written in its one spelling (params.yaml: DVC compares the text, so `sp+R64` or ` R64`
    would rerun every stage that reads the form for the same graph); any other spelling of a form the
    grammar reads is refused with the canonical one suggested."""
    form = parse(text)
    if text != str(form):
        raise ClefError(f"form {text!r} is not written canonically; did you mean {form}?")
    return form


def check_exportable(form: Form) -> None:
    """Refuse a form the exporter cannot turn into a delegate-ready graph, before any conversion."""
    if form.loop:
        raise ClefError(f"form {form} cannot be exported: the loop inverse unrolls ~1,000 ops per layer; use R<n>")
    if not form.dd:
        raise ClefError(f"form {form} cannot be exported: cumsum lowers to CUMSUM, which GPU delegates reject; add dd")
