"""scripts/bench/gpu_parts.py: the pieces the GPU bench takes apart are the kernel's own, and put back
together they are the kernel."""

import dataclasses

import torch

from scripts.bench import gpu_parts
from scripts.layers import gated_delta, kernel_form


def captured(length=128, heads=2, dk=16, dv=16, seed=0):
    """The kernel's inputs as capture() holds them; what the kernel does not take is left None."""
    gen = torch.Generator().manual_seed(seed)
    kernel_inputs = {
        "q": torch.randn(1, length, heads, dk, generator=gen),
        "k": torch.randn(1, length, heads, dk, generator=gen),
        "v": torch.randn(1, length, heads, dv, generator=gen),
        "g": -torch.rand(1, length, heads, generator=gen),
        "beta": torch.rand(1, length, heads, generator=gen),
    }
    rest = {f.name: None for f in dataclasses.fields(gpu_parts.Captured) if f.name not in kernel_inputs}
    return gpu_parts.Captured(**rest, **kernel_inputs)


def test_the_pieces_put_back_together_are_the_kernel():
    """recurrence(kernel_pieces) must give the kernel's output: a piece computed another way than the
    kernel computes it (the re-implementation this replaced could drift) fails here."""
    form = kernel_form.parse(gpu_parts.FORM)
    c = captured()
    p = gpu_parts.kernel_pieces(c, form)
    joined = gpu_parts.recurrence(None, p.u, p.w, p.q_decayed, p.intra, p.k_tail, p.carry)
    n, h, chunk, dv = p.u.shape
    ours = joined["out"].reshape(h, n * chunk, dv).transpose(0, 1).unsqueeze(0) / form.v_scale
    out, _ = gated_delta.make_kernel(form)(c.q, c.k, c.v, g=c.g, beta=c.beta, use_qk_l2norm_in_kernel=True)
    assert torch.allclose(ours, out / form.v_scale, rtol=1e-4, atol=1e-5)
    p = dataclasses.replace(p, u=p.u * 1.001)  # one piece off
    off = gpu_parts.recurrence(None, p.u, p.w, p.q_decayed, p.intra, p.k_tail, p.carry)
    assert not torch.allclose(off["out"], joined["out"], rtol=1e-4, atol=1e-5)
