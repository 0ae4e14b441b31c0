"""Faults injected on purpose: each check is rerun with the fault it exists to catch, and must fail.

A check whose figure does not move when its fault is present cannot see that fault, however small
the figure is. The checks rerun under these and record the error they then report; a stage fails
when that error breaks its bound by less than `controls.min_over_threshold` (params.yaml).
- `memory_cut`: the form's kernel with the state zeroed at each of its chunk boundaries: a kernel
  that dropped the state carried between chunks. It exists only where a record spans more than one
  chunk (not in a 64-token graph under R64); `applies` says where.
- `without_pad_guard`: a right pad's decay no longer set to identity, so pads decay the recurrent
  state: what a padded prefix hands its suffix then differs from the state at its last real token.
- a pair's recurrent state zeroed between prefix and suffix: `zero_recurrent` (pair_check).
"""
from __future__ import annotations

import contextlib

from scripts import clef_kernel
from scripts.clef_qwen35_patch import ClefGatedDeltaNet


def _form(form) -> clef_kernel.Form:
    return clef_kernel.parse(form) if isinstance(form, str) else form


def memory_cut_kernel(form: clef_kernel.Form | str):
    return clef_kernel.make_kernel(_form(form), carry_state=False)


def memory_cut_applies(form: clef_kernel.Form | str, length: int) -> bool:
    """Whether a record of `length` tokens has a chunk boundary under `form` for the fault to cut."""
    return length > _form(form).chunk


@contextlib.contextmanager
def memory_cut(model, form: clef_kernel.Form | str):
    """Inside the block every GatedDeltaNet of `model` runs memory_cut_kernel(form); restored on exit."""
    kernel = memory_cut_kernel(form)
    layers = clef_kernel.gated_deltanets(model)
    saved = [m.__dict__.get("chunk_gated_delta_rule") for m in layers]
    try:
        for m in layers:
            m.chunk_gated_delta_rule = kernel
        yield
    finally:
        for m, k in zip(layers, saved):
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
    return {k: (v * 0.0 if k.endswith("_recurrent") else v) for k, v in tensors.items()}


def margin(control_error, threshold: float) -> float:
    """How many times the bound the fault's error is (NaN and inf count as infinitely far)."""
    import math

    if control_error is None:
        return None
    if not math.isfinite(control_error):
        return float("inf")
    return control_error / threshold


def problems(name: str, control_error, threshold: float, min_over: float) -> list[str]:
    """One line when the fault `name` moves the check's figure by less than min_over x its bound.
    None: the fault does not exist in any of the check's records (recorded as not applying)."""
    if control_error is None:
        return []
    m = margin(control_error, threshold)
    if m >= min_over:
        return []
    return [f"control {name}: the fault gives {control_error:.3g}, {m:.3g}x the bound {threshold:g} (needs >= {min_over:g}x): "
            "the check cannot see the failure it is named after"]
