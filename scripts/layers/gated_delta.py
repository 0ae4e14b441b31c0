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
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Chunking:
    """How a [B, L, H, ...] sequence lies chunk-major: B*H rows per chunk, L padded to whole chunks."""

    batch: int
    heads: int
    length: int
    chunk: int

    @property
    def pad(self) -> int:  # padded tokens: g = 0 (no decay), beta = 0 (no update), so the state passes through
        return (self.chunk - self.length % self.chunk) % self.chunk

    @property
    def chunks(self) -> int:
        return (self.length + self.pad) // self.chunk

    @property
    def rows(self) -> int:  # B*H: one chunk's rows
        return self.batch * self.heads

    def to_chunks(self, x: torch.Tensor, tail_dims: tuple[int, ...]) -> torch.Tensor:
        """[B, L, H, *D] -> [N * B*H, C, *D]: chunk i is rows [i BH, (i + 1) BH), one contiguous slice, and
        rank 3, so every batched matmul after it runs without the reshapes a rank-4 operand costs."""
        bh, c, n = self.rows, self.chunk, self.chunks
        x = x.transpose(1, 2).reshape(bh, self.length, *(tail_dims or (1,)))
        # zeros joined by concatenation, not PAD: LiteRT's GPU accelerator refuses a rank-2 PAD and,
        # measured on it, computes a rank-3 one wrong (verify_gpu and tests/test_gpu_accelerator.py)
        if self.pad:
            x = torch.cat([x, torch.zeros(bh, self.pad, x.shape[-1], dtype=x.dtype)], dim=1)
        x = x.reshape(bh, n, c, *tail_dims).transpose(0, 1)
        return x.reshape(n * bh, c, *tail_dims)

    def from_chunks(self, out: torch.Tensor) -> torch.Tensor:
        """[N * B*H, C, Dv] -> [B, L, H, Dv], the padding dropped."""
        b, h, dv = self.batch, self.heads, out.shape[-1]
        out = out.reshape(self.chunks, b * h, self.chunk, dv).transpose(0, 1)
        out = out.reshape(b * h, self.chunks * self.chunk, dv)[:, : self.length]
        return out.reshape(b, h, self.length, dv).transpose(1, 2)


@dataclass(frozen=True)
class InChunk:
    """What every chunk computes from its own tokens, for all chunks at once (none of it reads the state)."""

    q: torch.Tensor  # [.., C, Dk] scaled by Dk^-0.5
    k: torch.Tensor  # [.., C, Dk]
    k_beta: torch.Tensor  # [.., C, Dk] k * beta
    pair: torch.Tensor  # [.., C, C] log-decay from token j to token i (sum of g over (j, i])
    prefix: torch.Tensor  # [.., C] log-decay from the chunk's start to each token
    total: torch.Tensor  # [..] log-decay over the whole chunk
    tail: torch.Tensor  # [.., C] log-decay from each token to the chunk's end
    n_mat: torch.Tensor  # [.., C, C] N, strictly lower
    t_mat: torch.Tensor  # [.., C, C] (I - N)^-1
    u: torch.Tensor  # [.., C, Dv] T (v beta): the chunk's new values against a zero state
    intra: torch.Tensor  # [.., C, C] (q k^T) masked by the in-chunk decay


def in_chunk(q, k, v, beta, g, form: Form, const: ChunkConstants) -> InChunk:
    """The in-chunk solve on chunked tensors [.., C, D] (any leading dims): decays, the strictly lower
    N = -(k beta k^T) x decay, T = (I - N)^-1, u = T v beta and the masked q k^T."""
    pair, prefix, total, tail = decays(g, form, const)
    gamma = pair_decay(pair, form, const)  # [.., C, C]
    k_beta = k * beta.unsqueeze(-1)
    n_mat = -(k_beta @ k.transpose(-1, -2)) * gamma * const.strict_lower.to(q.dtype)
    t_mat = (loop_inverse if form.loop else block_inverse)(n_mat, const)
    u = t_mat @ (v * beta.unsqueeze(-1))
    intra = (q @ k.transpose(-1, -2)) * gamma
    return InChunk(q, k, k_beta, pair, prefix, total, tail, n_mat, t_mat, u, intra)


def decayed(ic: InChunk, form: Form):
    """-> (w [.., C, Dk], q decayed to the chunk's start [.., C, Dk], k_tail [.., Dk, C]): the terms
    that meet the state entering the chunk."""
    to_start = decay_exp(ic.prefix, form).unsqueeze(-1)
    w = ic.t_mat @ (ic.k_beta * to_start)
    k_tail = (ic.k * decay_exp(ic.tail, form).unsqueeze(-1)).transpose(-1, -2)
    return w, ic.q * to_start, k_tail


def carry(ic: InChunk, form: Form) -> torch.Tensor:
    """exp(total) [.., 1, 1]: how much of the state survives a chunk."""
    return decay_exp(ic.total, form).unsqueeze(-1).unsqueeze(-1)


def state_loop(ic: InChunk, form: Form, chunks: int, state, carry_state: bool = True):
    """The stock kernel's order, chunk by chunk: v_new = u - w S, out = q_dec S + intra v_new,
    S <- carry S + k_tail v_new. -> (out [N BH, C, Dv], final state [BH, Dk, Dv])."""
    bh = ic.u.shape[0] // chunks
    w, q_decayed, k_tail = decayed(ic, form)
    keep = carry(ic, form)
    if state is None:
        state = torch.zeros(bh, ic.k.shape[-1], ic.u.shape[-1], dtype=ic.u.dtype)
    outs = []
    for i in range(chunks):
        rows = slice(i * bh, (i + 1) * bh)
        if i and not carry_state:
            state = torch.zeros_like(state)
        v_new = ic.u[rows] - w[rows] @ state
        outs.append(q_decayed[rows] @ state + ic.intra[rows] @ v_new)
        state = state * keep[rows] + k_tail[rows] @ v_new
    return torch.cat(outs, dim=0), state


def state_unrolled(ic: InChunk, form: Form, chunks: int, state, final: bool, carry_state: bool = True):
    """The stock order regrouped so that only the states are sequential. With S_i the state entering
    chunk i: out_i = intra_i u_i + read_i S_i, read_i = q_dec_i - intra_i w_i, S_i+1 = step_i S_i + write_i,
    step_i = carry_i I - k_tail_i w_i, write_i = k_tail_i u_i. read, step and write are computed for all
    chunks at once; the unrolled loop holds one matmul and one add per chunk, and one matmul reads every
    chunk's state. -> (out [N BH, C, Dv], final state or the last state computed)."""
    out = ic.intra @ ic.u
    if chunks == 1 and state is None and not final:
        return out, state
    bh, dk, dv = ic.u.shape[0] // chunks, ic.k.shape[-1], ic.u.shape[-1]
    dtype = ic.u.dtype
    w, q_decayed, k_tail = decayed(ic, form)

    def per_chunk(x):  # slices, not torch.split: the converter fails on a split into one piece
        return [x[i * bh : (i + 1) * bh] for i in range(chunks)]

    keep = carry(ic, form)
    # identity from numpy: a constant in the graph (torch.eye would trace to an IOTA op)
    eye = torch.from_numpy(np.eye(dk, dtype=np.float32)).to(dtype)
    step = per_chunk(keep * eye - k_tail @ w)
    write = per_chunk(k_tail @ ic.u)
    entering = []  # S_i per chunk (a zero block where S_i is zero)
    for i in range(chunks):  # unrolled at a fixed L
        if i and not carry_state:
            state = None
        entering.append(torch.zeros(bh, dk, dv, dtype=dtype) if state is None else state)
        if i < chunks - 1 or final:
            state = write[i] if state is None else step[i] @ state + write[i]
    return out + (q_decayed - ic.intra @ w) @ torch.cat(entering, dim=0), state


def recurrence_f64(q, k, v, g, beta, s0):
    """The reference the kernels are held to: the gated delta rule token by token in float64,
    S <- S e^g; S <- S + k (beta (v - S^T k))^T; o = S^T q (q, k l2-normed, q scaled by Dk^-0.5)."""
    q, k, v, g, beta = (x.to(torch.float64) for x in (q, k, v, g, beta))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    b, length, h, dk = k.shape
    s = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64) if s0 is None else s0.to(torch.float64).clone()
    outs = []
    for t in range(length):
        s = s * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - (s * k[:, t, :, :, None]).sum(-2)) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outs, 1), s


@dataclass(frozen=True)
class ChunkKernel:
    """The chunk kernel of `form`, called with transformers' chunk-kernel signature.

    carry_state=False zeroes the state at every chunk boundary: not a form, the fault verification
    injects on purpose to show that its checks see a lost memory (scripts/checks/controls.py).

    q, k [B, L, H, Dk] (already interleaved to the value-head count), v [B, L, H, Dv], g and beta
    [B, L, H], initial_state [B, H, Dk, Dv] (2^vs x stock under vs<k>). Returns (out [B, L, H, Dv],
    final state [B, H, Dk, Dv] or None), both 2^vs x stock. Computes in the inputs' dtype.
    """

    form: Form
    carry_state: bool = True
    # built here, outside any trace: built inside one, arange and eye would trace to IOTA ops
    const: ChunkConstants = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "const", chunk_constants(self.form.chunk))

    @property
    def __name__(self) -> str:  # what a model's description names its kernel by, as a function's name
        return f"chunk_gated_delta_rule[{self.form}]" + ("" if self.carry_state else "[state zeroed per chunk]")

    @property
    def softplus(self):
        """The decay's softplus under this form: the patched GatedDeltaNet computes g with it."""
        return safe_softplus if self.form.sp else torch.nn.functional.softplus

    def __call__(
        self,
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
        form = self.form
        b, length, h, dk = key.shape
        dv = value.shape[-1]
        if initial_state is not None and tuple(initial_state.shape) != (b, h, dk, dv):
            raise ClefError(
                f"initial state of shape {list(initial_state.shape)} does not fit this layer: "
                f"expected [{b}, {h}, {dk}, {dv}] (batch, value heads, key dim, value dim)"
            )
        if use_qk_l2norm_in_kernel:
            query, key = l2norm(query), l2norm(key)
        if form.vs:
            value = value * form.v_scale  # a power of two: exact, every later product scales exactly
        if form.ec:
            g = torch.clamp_min(g, G_FLOOR)
        at = Chunking(b, h, length, form.chunk)
        q = at.to_chunks(query, (dk,)) * (dk**-0.5)
        k = at.to_chunks(key, (dk,))
        v = at.to_chunks(value, (dv,))
        beta_c = at.to_chunks(beta, ())
        g_c = at.to_chunks(g, ())
        ic = in_chunk(q, k, v, beta_c, g_c, form, self.const)
        state = None if initial_state is None else initial_state.to(query.dtype).reshape(at.rows, dk, dv)
        if form.loop:  # the stock algorithm in this layout
            out, state = state_loop(ic, form, at.chunks, state, self.carry_state)
        else:
            out, state = state_unrolled(ic, form, at.chunks, state, output_final_state, self.carry_state)
        final = state.reshape(b, h, dk, dv) if output_final_state else None
        return at.from_chunks(out), final


def make_kernel(form: Form, carry_state: bool = True) -> ChunkKernel:
    """The chunk kernel of `form` (ChunkKernel); carry_state=False is the verification's fault."""
    return ChunkKernel(form, carry_state)


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


@dataclass(frozen=True)
class FormChange:
    """What `set_form` did to a model: the form, how many GatedDeltaNets took it, their kernel, where
    the softplus comes from, and the factor on the gated norm's eps."""

    form: str
    layers: int
    kernel: str
    softplus: str  # "stock", "safe", or "not applied (stock class)"
    norm_eps_scale: float


def set_form(model: torch.nn.Module, form: Form | str) -> FormChange:
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
    return FormChange(
        form=str(form),
        layers=len(layers),
        kernel=layers[0].chunk_gated_delta_rule.__name__,
        softplus="stock" if not form.sp else ("not applied (stock class)" if stock_class else "safe"),
        norm_eps_scale=form.v_scale**2,
    )


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
