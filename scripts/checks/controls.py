"""Faults injected on purpose: each check is rerun with the fault it exists to catch, and must fail.

A check whose figure does not move when its fault is present cannot see that fault, however small
the figure is. The checks rerun under these and record the error they then report; a stage fails
when that error breaks its bound by less than `controls.min_over_threshold` (params.yaml;
scripts/checks/compare.py control_problems judges it).
The faults on a model are applied through scripts/qwen35/model_change.py `changed`, which restores it:
- `memory_cut`: the form's kernel with the state zeroed at each of its chunk boundaries: a kernel
  that dropped the state carried between chunks. It exists only where a record spans more than one
  chunk (not in a 64-token graph under R64); `memory_cut_applies` says where.
- `pad_guard=False`: a right pad's decay no longer set to identity, so pads decay the recurrent
  state: what a padded prefix hands its suffix then differs from the state at its last real token.
- a pair's recurrent state zeroed between prefix and suffix: `zero_recurrent` (pair_check).
"""

from __future__ import annotations

import torch

from scripts.layers import kernel_form
from scripts.pipeline.mappings import Tensors


def _form(form) -> kernel_form.Form:
    return kernel_form.parse(form) if isinstance(form, str) else form


def memory_cut_applies(form: kernel_form.Form | str, length: int) -> bool:
    """Whether a record of `length` tokens has a chunk boundary under `form` for the fault to cut."""
    return length > _form(form).chunk


def zero_recurrent(tensors: Tensors) -> Tensors:
    """A pair state with every GatedDeltaNet recurrent state zeroed (conv state, K/V and slots kept)."""
    return {k: (torch.zeros_like(v) if k.endswith("_recurrent") else v) for k, v in tensors.items()}
