"""Faults injected on purpose: each check is rerun with the fault it exists to catch, and must fail.

A check whose figure does not move when its fault is present cannot see that fault, however small
the figure is. The checks rerun under these and record the error they then report; a stage fails
when that error breaks its bound by less than `controls.min_over_threshold` (params.yaml;
scripts/checks/compare.py control_problems judges it).
- `memory_cut`: the form's kernel with the state zeroed at each of its chunk boundaries: a kernel
  that dropped the state carried between chunks. It exists only where a record spans more than one
  chunk (not in a 64-token graph under R64); `applies` says where.
- `without_pad_guard`: a right pad's decay no longer set to identity, so pads decay the recurrent
  state: what a padded prefix hands its suffix then differs from the state at its last real token.
- a pair's recurrent state zeroed between prefix and suffix: `zero_recurrent` (pair_check).
"""

from __future__ import annotations

import contextlib

import torch

from scripts.layers import gated_delta, kernel_form
from scripts.qwen35.patch import ClefGatedDeltaNet


def _form(form) -> kernel_form.Form:
    return kernel_form.parse(form) if isinstance(form, str) else form


def memory_cut_kernel(form: kernel_form.Form | str):
    """The form's kernel with the state zeroed at each chunk boundary (clef_kernel's carry_state)."""
    return gated_delta.make_kernel(_form(form), carry_state=False)


def memory_cut_applies(form: kernel_form.Form | str, length: int) -> bool:
    """Whether a record of `length` tokens has a chunk boundary under `form` for the fault to cut."""
    return length > _form(form).chunk


@contextlib.contextmanager
def memory_cut(model, form: kernel_form.Form | str):
    """Inside the block every GatedDeltaNet of `model` runs memory_cut_kernel(form); restored on exit."""
    kernel = memory_cut_kernel(form)
    layers = gated_delta.gated_deltanets(model)
    saved = [m.__dict__.get("chunk_gated_delta_rule") for m in layers]
    try:
        for m in layers:
            m.chunk_gated_delta_rule = kernel
        yield
    finally:
        for m, k in zip(layers, saved, strict=True):
            if k is None:
                m.__dict__.pop("chunk_gated_delta_rule", None)
            else:
                m.chunk_gated_delta_rule = k


@contextlib.contextmanager
def without_pad_guard():
    """Inside the block, pads of every ClefGatedDeltaNet decay the state; restored on exit."""
    ClefGatedDeltaNet.pad_decay_guard = False
    try:
        yield
    finally:
        ClefGatedDeltaNet.pad_decay_guard = True


def zero_recurrent(tensors: dict) -> dict:
    """A pair state with every GatedDeltaNet recurrent state zeroed (conv state, K/V and slots kept)."""
    return {k: (torch.zeros_like(v) if k.endswith("_recurrent") else v) for k, v in tensors.items()}
