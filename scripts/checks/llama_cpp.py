"""llama.cpp's published decision figures, the field's scale for ours (facts carried over, cited once here).

From llama.cpp's `llama-perplexity --kl-divergence` table for Llama-3-8B (wikitext-2, context 512, each
quantization against the fp16 model's logits), as its tools/perplexity README gives them; None where that
table has no figure. Torch-free: the docs renderer and the release card read it.
"""

from __future__ import annotations

import dataclasses

SOURCE = "llama.cpp llama-perplexity --kl-divergence, Llama-3-8B, wikitext-2, ctx 512, vs fp16"


@dataclasses.dataclass(frozen=True)
class Published:
    name: str
    kld_mean: float
    same_top: float
    ppl_ratio: float | None = None


FIGURES = (
    Published("bf16", 2.5e-5, 0.9974),
    Published("q8_0", 1.36e-3, 0.9767, 1.0004),
    Published("q6_K", 5.45e-3, 0.9603),
    Published("q4_K_M", 0.031, 0.9190),
)

# Our `weights` beside the llama.cpp quantization of the same bits per weight class (the KL-divergence issue's
# comparison: int8 per channel against q8_0, int4 against q4_K_M, llama.cpp's default).
SAME_BITS = {"int8": "q8_0", "int4": "q4_K_M"}


def published(name: str) -> Published:
    return next(f for f in FIGURES if f.name == name)
