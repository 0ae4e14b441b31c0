"""One way to change a loaded stack for a while: `changed(model, ...)` applies what export and the
checks ask for and always puts the model back as it was, in reverse order, whatever stopped the block.

What it can change, each named by a keyword:
- patch: the row graph's classes (scripts/qwen35/patch.py), swapped in place;
- form: a kernel form in every GatedDeltaNet, the gated norm's eps with it (gated_delta.form_applied);
- memory_cut: the control's fault, the current form's kernel with the state zeroed at each chunk
  boundary (scripts/checks/controls.py says why a check runs it);
- pad_guard=False: the other control's fault, pads that decay the state (per instance, not per class);
- split_over: every nn.Linear of the model over that many bytes as row blocks (split_linear; exact);
- count_interleave: the ClefGatedDeltaNets' interleave_heads calls counted;
- dynamic_activations: every nn.Linear reads its input as the CPU's dynamic kernels quantize it
  (scripts/layers/dynamic_activations.py: the CPU's arithmetic for graphs of the dynamic scheme).

A model built once for one form and kept (patch.load, a float64 reference) is made with patch.patch and
gated_delta.set_form; this is for everything that must not outlive a block.
"""

from __future__ import annotations

import contextlib
import dataclasses

from torch import nn

from scripts.layers import dynamic_activations, gated_delta, split_linear
from scripts.layers.kernel_form import Form
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import patch as row_patch


@dataclasses.dataclass
class Changes:
    """What a `changed` block did: the form's report (set_form), the Linears split, the interleave count."""

    form: gated_delta.FormChange | None = None
    split: int | None = None
    interleave_calls: dict[str, int] | None = None


@contextlib.contextmanager
def _classes_patched(model: nn.Module):
    """patch.patch inside the block; every module's class and the attention setting restored after."""
    saved = [(m, m.__class__) for m in model.modules()]
    attention = model.config._attn_implementation
    try:
        yield row_patch.patch(model)
    finally:
        for m, cls in saved:
            m.__class__ = cls
        model.config._attn_implementation = attention


@contextlib.contextmanager
def _instance_attribute(modules: list, name: str, value):
    """`name` set to `value` on each instance inside the block; the instance's own value (or none, so the
    class's shows again) restored after."""
    missing = object()
    saved = [m.__dict__.get(name, missing) for m in modules]
    try:
        for m in modules:
            setattr(m, name, value)
        yield
    finally:
        for m, old in zip(modules, saved, strict=True):
            if old is missing:
                m.__dict__.pop(name, None)
            else:
                setattr(m, name, old)


@contextlib.contextmanager
def _linear_inputs_quantized(model: nn.Module):
    """Each nn.Linear of `model` fed dynamic_activations.quantized_rows of its input inside the block; the
    hooks removed after. A model with no Linear is refused (the change would change nothing)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ClefError(f"dynamic_activations: {type(model).__name__} holds no nn.Linear")
    hooks = [
        m.register_forward_pre_hook(lambda _m, args: (dynamic_activations.quantized_rows(args[0]), *args[1:]))
        for m in linears
    ]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def _clef_deltanets(model: nn.Module, what: str) -> list:
    """The row graph's GatedDeltaNets in `model`; a change that would find none (and so change nothing,
    silently) is refused."""
    found = [m for m in model.modules() if isinstance(m, row_patch.ClefGatedDeltaNet)]
    if not found:
        raise ClefError(f"{what}: {type(model).__name__} holds no ClefGatedDeltaNet (patch it first)")
    return found


@contextlib.contextmanager
def changed(
    model: nn.Module,
    *,
    patch: bool = False,
    form: Form | str | None = None,
    memory_cut: bool = False,
    pad_guard: bool = True,
    split_over: int | None = None,
    count_interleave: bool = False,
    dynamic_activations: bool = False,
):
    """`model` changed as the keywords say inside the block (the module docstring lists them); -> Changes."""
    done = Changes()
    with contextlib.ExitStack() as stack:
        if patch:
            stack.enter_context(_classes_patched(model))
        if form is not None:
            done.form = stack.enter_context(gated_delta.form_applied(model, form))
        if memory_cut:
            layers = gated_delta.gated_deltanets(model)
            if not layers:
                raise ClefError(f"memory_cut: {type(model).__name__} holds no GatedDeltaNet")
            current = layers[0].chunk_gated_delta_rule.form
            kernel = gated_delta.make_kernel(current, carry_state=False)
            stack.enter_context(_instance_attribute(layers, "chunk_gated_delta_rule", kernel))
        if not pad_guard:
            unguarded = _clef_deltanets(model, "pad_guard=False")
            stack.enter_context(_instance_attribute(unguarded, "pad_decay_guard", False))
        if split_over is not None:
            done.split = stack.enter_context(split_linear.split_linears([model], split_over))
        if count_interleave:
            done.interleave_calls = counter = {"calls": 0}

            def counted(x, r):
                counter["calls"] += 1
                return row_patch.interleave_heads(x, r)

            counted_layers = _clef_deltanets(model, "count_interleave")
            stack.enter_context(_instance_attribute(counted_layers, "interleave_heads", counted))
        if dynamic_activations:
            stack.enter_context(_linear_inputs_quantized(model))
        yield done
