"""clef-litert's library: the stages in `stages/` are thin entry points over these modules."""

import logging

# transformers imports torchao (a litert-torch dependency) at start-up, and torchao logs warnings
# about CUDA-only extensions and a torch deprecation on every import. They say nothing about our
# work and would bury a stage's one-line error, so they are silenced here, for every entry point.
# So is transformers' note that the fla/causal-conv1d fast path is missing: we never use it.
for _name in ("torchao", "torch.utils._pytree", "transformers.models.qwen3_5.modeling_qwen3_5"):
    logging.getLogger(_name).setLevel(logging.ERROR)
