"""GatedDeltaNet kernel forms: the chunked gated delta rule each form computes, and how a model takes one.

The form grammar (R<n>, loop, sp, ec, dd, cumsum, vs<k>) and what each part means live in
scripts/layers/kernel_form.py. Why the parts exist: a LiteRT graph for GPU delegates needs rank <= 4
tensors, builtin ops only (no CUMSUM, IOTA, WHILE), no loops, and must stay finite in fp16. The
kernel works on rank-3 tensors laid out chunk-major, [chunks x B*H, C, D] (each chunk is one
contiguous block of rows, and batched matmuls need no reshapes), builds every mask once as a
constant, computes everything that does not depend on the state for all chunks at once, and unrolls
only what does: two matmuls per chunk, at a fixed L.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np
import torch

from scripts.layers.kernel_form import STOCK, Form, parse
from scripts.pipeline.errors import ClefError

L2NORM_EPS = 1e-6  # the stock kernel's (and fla's) l2norm eps
# ec floors each token's log-decay g at -30: exp(-30) ~ 9e-14 is below fp32's resolution next to 1,
# so the floor changes no result, and it keeps an in-chunk sum of g >= -30 x 128 = -3840, far inside
# fp16's range (65504), so no sum of g can overflow to -inf on a GPU delegate running in fp16.
G_FLOOR = -30.0


# ---------------------------------------------------------------------------------------------
# constants, built once per chunk size (float32; cast to the kernel's dtype at use)


@dataclass(frozen=True)
class ChunkConstants:
    identity: torch.Tensor  # [C, C]
    lower: torch.Tensor  # [C, C] 1 on and below the diagonal
    strict_lower: torch.Tensor  # [C, C] 1 below the diagonal
    upper_strict_bool: torch.Tensor  # [C, C] True above the diagonal (the -inf mask without ec)
    cum_incl: torch.Tensor  # [C, C] g @ cum_incl = inclusive prefix sums
    cum_tail: torch.Tensor  # [C, C] g @ cum_tail = sums over t > i (decay from i to the chunk's end)
    segments: torch.Tensor  # [C, C*C] g @ segments = sum of g_t for j < t <= i, at [i, j] (0 for j >= i)
    block_masks: tuple  # per doubling step b = 1, 2, 4, ...: the lower-left b x b block of each 2b block


@functools.cache
def chunk_constants(c: int) -> ChunkConstants:
    i = torch.arange(c)
    row, col = i[:, None], i[None, :]
    t = i[:, None, None]  # token index for the segment matrix
    segments = ((t > col[None]) & (t <= row[None])).to(torch.float32)  # [t, i, j]
    masks = []
    b = 1
    while b < c:
        same_pair = (row // (2 * b)) == (col // (2 * b))
        masks.append((same_pair & ((row // b) % 2 == 1) & ((col // b) % 2 == 0)).to(torch.float32))
        b *= 2
    return ChunkConstants(
        identity=torch.eye(c),
        lower=(col <= row).to(torch.float32),
        strict_lower=(col < row).to(torch.float32),
        upper_strict_bool=col > row,
        cum_incl=(row <= col).to(torch.float32),  # [t, i]: t contributes to the prefix sum at i when t <= i
        cum_tail=(row > col).to(torch.float32),  # [t, i]: t contributes to the tail sum at i when t > i
        segments=segments.reshape(c, c * c),
        block_masks=tuple(masks),
    )


# ---------------------------------------------------------------------------------------------
# the pieces of the kernel


def log1p_series(y: torch.Tensor) -> torch.Tensor:
    """log1p(y) for 0 <= y <= 1 as 2 atanh(s), s = y / (2 + y) <= 1/3, by its odd series to s^21 (the
    next term is < 1e-12 relative). LiteRT has no LOG1P: torch.log1p converts to LOG(1 + y), and 1 + y
    rounds y away: to 0 in fp16 for y < 4.9e-4, and with ~1e-7 / y relative error in fp32, which for the
    slow decays of a head with memory (softplus ~1e-5) is a percent of g."""
    s = y / (2.0 + y)
    s2 = s * s
    p = s2 * (1.0 / 21.0) + 1.0 / 19.0
    for n in (17, 15, 13, 11, 9, 7, 5, 3, 1):
        p = p * s2 + 1.0 / n
    return 2.0 * s * p


def safe_softplus(x: torch.Tensor) -> torch.Tensor:
    """softplus(x) = max(x, 0) + log1p(exp(-|x|)): the exp argument is <= 0, so nothing overflows."""
    return torch.clamp_min(x, 0.0) + log1p_series(torch.exp(-torch.abs(x)))


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def block_inverse(n: torch.Tensor, const: ChunkConstants) -> torch.Tensor:
    """(I - N)^-1 for strictly lower-triangular N [..., C, C], in log2(C) doubling steps, no loop over rows.

    X starts as the inverse of the 1x1 diagonal blocks (I). Each step joins pairs of b x b diagonal
    blocks [[A, 0], [B, D]] of I - N into a 2b block, whose inverse is [[A^-1, 0], [-D^-1 B A^-1, D^-1]]:
    in full-matrix form X <- X + X (N masked to the B blocks) X. Every X is the exact inverse of a
    sub-block, so its entries stay as small as the answer's. The Neumann product (I + N)(I + N^2)...
    computes the same matrix through powers of N whose entries reach ~1e8 when every key is the same
    (regime one_key), and loses everything to cancellation in fp32; this form is measured exact there.
    """
    first, *rest = const.block_masks
    x = const.identity.to(n.dtype) + n * first.to(n.dtype)  # the b = 1 step with X = I needs no product
    for mask in rest:
        x = x + x @ (n * mask.to(n.dtype)) @ x
    return x


def loop_inverse(n: torch.Tensor, const: ChunkConstants) -> torch.Tensor:
    """(I - N)^-1 by the stock kernel's row-by-row forward substitution (C - 1 sequential updates)."""
    t = n.clone()
    for i in range(1, n.shape[-1]):
        row = t[..., i, :i].clone()
        sub = t[..., :i, :i].clone()
        t[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    return t + const.identity.to(n.dtype)


def decays(g: torch.Tensor, form: Form, const: ChunkConstants):
    """Log-decays of chunked g [..., C] (one row per chunk of one head) ->
    (pair [..., C, C] = sum of g over (j, i], prefix [..., C], total [...], tail [..., C])."""
    *lead, c = g.shape
    if form.dd:
        pair = (g @ const.segments.to(g.dtype)).reshape(*lead, c, c)
        prefix = g @ const.cum_incl.to(g.dtype)
        tail = g @ const.cum_tail.to(g.dtype)
        total = g.sum(-1)
    else:
        prefix = g.cumsum(-1)
        pair = prefix.unsqueeze(-1) - prefix.unsqueeze(-2)
        total = prefix[..., -1]
        tail = total.unsqueeze(-1) - prefix
    return pair, prefix, total, tail


def decay_exp(x: torch.Tensor, form: Form) -> torch.Tensor:
    return torch.exp(torch.clamp_max(x, 0.0)) if form.ec else torch.exp(x)


def pair_decay(pair: torch.Tensor, form: Form, const: ChunkConstants) -> torch.Tensor:
    """exp(pair) on and below the diagonal, 0 above it."""
    if form.ec:  # clamp, then zero by a 0/1 constant: no -inf anywhere
        return decay_exp(pair, form) * const.lower.to(pair.dtype)
    return torch.exp(pair.masked_fill(const.upper_strict_bool, float("-inf")))


def make_kernel(form: Form, carry_state: bool = True):
    """The chunk kernel of `form`, with transformers' chunk-kernel signature.

    carry_state=False zeroes the state at every chunk boundary: not a form, the fault verification
    injects on purpose to show that its checks see a lost memory (scripts/checks/controls.py).

    q, k [B, L, H, Dk] (already interleaved to the value-head count), v [B, L, H, Dv], g and beta
    [B, L, H], initial_state [B, H, Dk, Dv] (2^vs x stock under vs<k>). Returns (out [B, L, H, Dv],
    final state [B, H, Dk, Dv] or None), both 2^vs x stock. Computes in the inputs' dtype.
    """
    c = form.chunk
    const = chunk_constants(c)
    inverse = loop_inverse if form.loop else block_inverse

    def kernel(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        b, length, h, dk = key.shape
        dv = value.shape[-1]
        if initial_state is not None and tuple(initial_state.shape) != (b, h, dk, dv):
            raise ClefError(
                f"initial state of shape {list(initial_state.shape)} does not fit this layer: "
                f"expected [{b}, {h}, {dk}, {dv}] (batch, value heads, key dim, value dim)"
            )
        dtype = query.dtype
        if use_qk_l2norm_in_kernel:
            query, key = l2norm(query), l2norm(key)
        if form.vs:
            value = value * form.v_scale  # a power of two: exact, every later product scales exactly
        if form.ec:
            g = torch.clamp_min(g, G_FLOOR)
        pad = (c - length % c) % c  # pads: g = 0 (no decay) and beta = 0 (no update): the state passes through
        n_chunks = (length + pad) // c

        def chunk_major(x, tail_dims):  # [B, L, H, *D] -> [N * B*H, C, *D]: chunk-major rows, rank 3
            x = x.transpose(1, 2).reshape(b * h, length, *(tail_dims or (1,)))
            # zeros joined by concatenation, not PAD: LiteRT's GPU accelerator refuses a rank-2 PAD and,
            # measured on it, computes a rank-3 one wrong (verify_gpu and tests/test_gpu_accelerator.py)
            if pad:
                x = torch.cat([x, torch.zeros(b * h, pad, x.shape[-1], dtype=x.dtype)], dim=1)
            # chunk-major and rank 3: chunk i is rows [i BH, (i + 1) BH), one contiguous slice, and every
            # batched matmul below runs without the reshapes a rank-4 operand costs in the graph
            x = x.reshape(b * h, n_chunks, c, *tail_dims).transpose(0, 1)
            return x.reshape(n_chunks * b * h, c, *tail_dims)

        q = chunk_major(query, (dk,)) * (dk**-0.5)
        k = chunk_major(key, (dk,))
        v = chunk_major(value, (dv,))
        beta_c = chunk_major(beta, ())
        g_c = chunk_major(g, ())

        pair, prefix, total, tail = decays(g_c, form, const)
        gamma = pair_decay(pair, form, const)  # [N BH, C, C]
        k_beta = k * beta_c.unsqueeze(-1)
        n_mat = -(k_beta @ k.transpose(-1, -2)) * gamma * const.strict_lower.to(dtype)
        t_mat = inverse(n_mat, const)  # (I - N)^-1, [N BH, C, C]
        u = t_mat @ (v * beta_c.unsqueeze(-1))  # [N BH, C, Dv]
        intra = (q @ k.transpose(-1, -2)) * gamma  # [N BH, C, C]
        bh = b * h
        state = None if initial_state is None else initial_state.to(dtype).reshape(bh, dk, dv)

        def decayed():  # -> w [N BH, C, Dk], q decayed to the chunk's start [N BH, C, Dk], k_tail [N BH, Dk, C]
            to_start = decay_exp(prefix, form).unsqueeze(-1)
            w = t_mat @ (k_beta * to_start)
            k_tail = (k * decay_exp(tail, form).unsqueeze(-1)).transpose(-1, -2)
            return w, q * to_start, k_tail

        if form.loop:
            # the stock kernel's order within each chunk: `loop` is the stock algorithm in this layout
            w, q_decayed, k_tail = decayed()
            carry = decay_exp(total, form).unsqueeze(-1).unsqueeze(-1)  # [N BH, 1, 1]
            state = torch.zeros(bh, dk, dv, dtype=dtype) if state is None else state
            outs = []
            for i in range(n_chunks):
                rows = slice(i * bh, (i + 1) * bh)
                if i and not carry_state:
                    state = torch.zeros_like(state)
                v_new = u[rows] - w[rows] @ state
                outs.append(q_decayed[rows] @ state + intra[rows] @ v_new)
                state = state * carry[rows] + k_tail[rows] @ v_new
            out = torch.cat(outs, dim=0)
        else:
            # Every chunk's output from its own tokens, all chunks at once; then, with S_i the state
            # entering chunk i ([BH, Dk, Dv]):
            #   out_i += read_i S_i      read_i = q_i exp(prefix) - intra_i w_i                 [BH, C, Dk]
            #   S_i+1 = step_i S_i + write_i
            #       step_i = exp(total_i) I - k_tail_i w_i [BH, Dk, Dk], write_i = k_tail_i u_i [BH, Dk, Dv]
            # (the stock order, v_new = u - w S, out = q_dec S + intra v_new, S = carry S + k_tail v_new,
            # regrouped). read, step and write are computed once for all chunks; the unrolled loop holds
            # one matmul and one add per chunk (the states only), and one matmul reads every chunk's state.
            out = intra @ u
            if n_chunks > 1 or state is not None or output_final_state:
                w, q_decayed, k_tail = decayed()

                def per_chunk(x):  # slices, not torch.split: the converter fails on a split into one piece
                    return [x[i * bh : (i + 1) * bh] for i in range(n_chunks)]

                carry = decay_exp(total, form).unsqueeze(-1).unsqueeze(-1)  # [N BH, 1, 1]
                # identity from numpy: a constant in the graph (torch.eye would trace to an IOTA op)
                eye = torch.from_numpy(np.eye(dk, dtype=np.float32)).to(dtype)
                step = per_chunk(carry * eye - k_tail @ w)
                write = per_chunk(k_tail @ u)
                entering = []  # S_i per chunk (a zero block where S_i is zero)
                for i in range(n_chunks):  # unrolled at a fixed L
                    if i and not carry_state:
                        state = None
                    entering.append(torch.zeros(bh, dk, dv, dtype=dtype) if state is None else state)
                    if i < n_chunks - 1 or output_final_state:
                        state = write[i] if state is None else step[i] @ state + write[i]
                out = out + (q_decayed - intra @ w) @ torch.cat(entering, dim=0)
        final = state.reshape(b, h, dk, dv) if output_final_state else None
        out = out.reshape(n_chunks, b * h, c, dv).transpose(0, 1).reshape(b * h, n_chunks * c, dv)[:, :length]
        out = out.reshape(b, h, length, dv).transpose(1, 2)
        return out, final

    kernel.__name__ = f"chunk_gated_delta_rule[{form}]" + ("" if carry_state else "[state zeroed per chunk]")
    kernel.form = form
    # The form's softplus travels with its kernel: the patched GatedDeltaNet computes its decay with it.
    kernel.softplus = safe_softplus if form.sp else torch.nn.functional.softplus
    return kernel


# ---------------------------------------------------------------------------------------------
# apply / reset on a model


def gated_deltanets(model: torch.nn.Module) -> list:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    return [m for m in model.modules() if isinstance(m, Qwen3_5GatedDeltaNet)]


def _switch(layers: list, form: Form) -> None:
    """Every layer to `form`'s kernel; the gated norm's eps x 4^k under vs<k>, which makes the norm
    absorb the 2^k scale exactly (rms(2^k x) with eps 4^k e equals 2^k rms(x) with eps e). The stock
    eps is the current one over the current form's 4^k: powers of two, so no rounding accumulates."""
    kernel = make_kernel(form)
    for m in layers:
        current = getattr(m.chunk_gated_delta_rule, "form", STOCK)
        m.norm.variance_epsilon = m.norm.variance_epsilon / current.v_scale**2 * form.v_scale**2
        m.chunk_gated_delta_rule = kernel


def set_form(model: torch.nn.Module, form: Form | str) -> dict:
    """Every GatedDeltaNet of `model` computes with `form` from now on (a model built for one form:
    patched_model.load, a float64 reference); -> what changed. `form_applied` is the same for a block.

    The form's softplus is its kernel's: the patched GatedDeltaNet reads it there; stock layers call
    F.softplus themselves, so `sp` on a stock layer is reported as not applied."""
    form = parse(form) if isinstance(form, str) else form
    layers = gated_deltanets(model)
    if not layers:
        raise ClefError("set_form: the model has no GatedDeltaNet layer")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    _switch(layers, form)
    stock_class = any(type(m) is Qwen3_5GatedDeltaNet for m in layers)
    return {
        "form": str(form),
        "layers": len(layers),
        "kernel": layers[0].chunk_gated_delta_rule.__name__,
        "softplus": "stock" if not form.sp else ("not applied (stock class)" if stock_class else "safe"),
        "norm_eps_scale": form.v_scale**2,
    }


@contextlib.contextmanager
def form_applied(model: torch.nn.Module, form: Form | str):
    """`form` in every GatedDeltaNet of `model` inside the block; kernels and norm eps exactly as they
    were afterwards, whatever happens. -> what changed, as set_form says."""
    layers = gated_deltanets(model)
    saved = [(m, m.chunk_gated_delta_rule, m.norm.variance_epsilon) for m in layers]
    try:
        yield set_form(model, form)
    finally:
        for m, kernel, eps in saved:
            m.chunk_gated_delta_rule, m.norm.variance_epsilon = kernel, eps
