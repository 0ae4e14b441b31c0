"""The kernel forms: each part's effect in isolation, and the export-graph rules (the grammar:
tests/test_kernel_form.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from scripts.checks import compare, kernel_check
from scripts.layers import gated_delta, kernel_form
from scripts.pipeline.errors import ClefError

HEADS = {"k": 2, "v": 4, "k_dim": 32, "v_dim": 32}


def inputs(name="strong_decay", length=130, init=True, seed=0):
    return kernel_check.regime_inputs(name, length, seed, HEADS["k"], HEADS["v"], HEADS["k_dim"], HEADS["v_dim"], init)


def call(form, q, k, v, g, beta, s0=None):
    kern = gated_delta.make_kernel(kernel_form.parse(form) if isinstance(form, str) else form)
    return kern(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)


# --- kernels against the references --------------------------------------------------------


def test_loop_form_is_the_stock_kernel():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, g, beta, s0 = inputs("weak_decay", 200)
    ours = call("loop", q, k, v, g, beta, s0)
    stock = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    for a, b in zip(ours, stock, strict=True):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max()


@pytest.mark.parametrize("chunk", [16, 32, 64, 128])
def test_block_inverse_matches_loop_inverse(chunk):
    """R<n>'s loop-free inverse equals the stock row-by-row inverse to 1e-6, on real in-chunk matrices."""
    const = gated_delta.chunk_constants(chunk)
    gen = torch.Generator().manual_seed(chunk)
    k = F.normalize(torch.randn(8, chunk, 32, generator=gen), dim=-1)
    beta = torch.rand(8, chunk, 1, generator=gen)
    n = -((k * beta) @ k.transpose(-1, -2)) * const.strict_lower
    loop, block = gated_delta.loop_inverse(n, const), gated_delta.block_inverse(n, const)
    assert (block - loop).abs().max() <= 1e-6 * loop.abs().max()


def test_neumann_product_fails_where_block_inverse_holds():
    """Why R<n> uses block doubling: the product (I + N)(I + N^2)(I + N^4)... is exact in theory but
    goes through powers of N with entries ~1e8 when every key is equal (one_key), and fp32 loses it all."""
    c = 64
    const = gated_delta.chunk_constants(c)
    n = -0.5 * const.strict_lower  # one_key: one key, beta 0.5, no decay
    truth = torch.linalg.solve_triangular(
        torch.eye(c, dtype=torch.float64) - n.double(), torch.eye(c, dtype=torch.float64), upper=False
    )
    product, power = torch.eye(c) + n, n
    for _ in range(5):
        power = power @ power
        product = product + product @ power
    assert (product.double() - truth).abs().max() > 1.0  # the control: the Neumann product is unusable
    assert (gated_delta.block_inverse(n, const).double() - truth).abs().max() < 1e-6


@pytest.mark.parametrize("regime", kernel_check.REGIMES)
def test_release_form_matches_float64(regime):
    q, k, v, g, beta, s0 = inputs(regime, 200)
    out_t, state_t = gated_delta.recurrence_f64(q, k, v, g, beta, s0)
    out, state = kernel_check.run_form(kernel_form.parse("R64+sp+ec+dd+vs6"), (q, k, v, g, beta, s0))
    assert compare.rel(out, out_t) < 1e-5 and compare.rel(state, state_t) < 1e-5


def test_tail_that_is_not_a_chunk_multiple():
    """L = 130 is padded inside; the result equals the first 130 outputs of an L = 192 run."""
    q, k, v, g, beta, s0 = inputs("strong_decay", 192)
    full, _ = call("R64+ec+dd", q, k, v, g, beta, s0)
    cut, state = call("R64+ec+dd", *(x[:, :130] for x in (q, k, v, g, beta)), s0)
    assert cut.shape[1] == 130 and torch.allclose(cut, full[:, :130], atol=1e-6)
    out_t, state_t = gated_delta.recurrence_f64(*(x[:, :130] for x in (q, k, v, g, beta)), s0)
    assert compare.rel(state, state_t) < 1e-5


def test_kernel_bench_records_each_length_under_the_keys_it_always_had():
    """results/kernel_bench.json: the bench's fields, then one row per length with both kernels' figures."""
    doc = kernel_check.bench("R16+ec+dd", heads=2, head_dim=8, lengths=[8, 20], repeats=1).to_json()
    assert list(doc) == ["form", "heads", "head_dim", "repeats", "torch_threads", "rows"]
    assert [r["L"] for r in doc["rows"]] == [8, 20]
    assert list(doc["rows"][0]) == [
        "L",
        "stock_median_s",
        "form_median_s",
        "speedup_stock_over_form",
        "export_nodes_stock",
        "export_nodes_form",
    ]
    assert kernel_check.KernelBench.from_json(doc, "kernel_bench.json").to_json() == doc


def test_wrong_initial_state_shape_refused():
    q, k, v, g, beta, s0 = inputs("strong_decay", 64)
    with pytest.raises(ClefError, match=r"initial state of shape \[1, 4, 32, 16\] .* expected \[1, 4, 32, 32\]"):
        call("R64", q, k, v, g, beta, s0[..., :16])


# --- each part in isolation ----------------------------------------------------------------


def test_vs_scales_output_and_state_exactly():
    q, k, v, g, beta, s0 = inputs("strong_decay", 130)
    out0, state0 = call("R64+ec+dd", q, k, v, g, beta, s0)
    out6, state6 = call("R64+ec+dd+vs6", q, k, v, g, beta, s0 * 64)
    assert torch.equal(out6, out0 * 64) and torch.equal(state6, state0 * 64)


def test_vs_with_unscaled_state_is_wrong():
    """The control: a stock-scale state fed to a vs6 kernel gives a different answer."""
    q, k, v, g, beta, s0 = inputs("strong_decay", 130)
    out0, _ = call("R64+ec+dd", q, k, v, g, beta, s0)
    wrong, _ = call("R64+ec+dd+vs6", q, k, v, g, beta, s0)
    assert (wrong / 64 - out0).abs().max() > 1e-2 * out0.abs().max()


class Intermediates(TorchDispatchMode):
    """Records, for every op run under it, whether its float outputs are finite, and every exp input."""

    def __init__(self):
        super().__init__()
        self.nonfinite, self.exp_max = [], float("-inf")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.exp.default:
            self.exp_max = max(self.exp_max, float(args[0].max()))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                self.nonfinite.append(str(func))
        return out


def extreme_decay():
    q, k, v, g, beta, s0 = inputs("strong_decay", 130)
    g = g.clone()
    g[:, ::5] = -1e4  # a decay that wipes the state: e^-10000
    return q, k, v, g, beta, s0


def test_ec_keeps_every_intermediate_finite_and_every_exp_argument_nonpositive():
    data = extreme_decay()
    with Intermediates() as seen:
        out, state = call("R64+ec+dd", *data)
    assert seen.nonfinite == [] and seen.exp_max <= 0.0
    out_t, state_t = gated_delta.recurrence_f64(*data)
    assert compare.rel(out, out_t) < 1e-5


@pytest.mark.parametrize("form", ["R64+dd", "R64+ec"])
def test_without_ec_or_dd_the_same_inputs_leave_non_finite_intermediates(form):
    """The control: without ec the mask is -inf; with ec but cumsum, e^(large positive) before masking
    is avoided by the clamp, but the stock masking path still runs -inf through exp when ec is off."""
    with Intermediates() as seen:
        call(form, *extreme_decay())
    if form == "R64+dd":
        assert seen.nonfinite, "masking with -inf should show as a non-finite intermediate"
    else:
        assert seen.nonfinite == [] and seen.exp_max <= 0.0


def test_ec_and_dd_stay_finite_in_fp16_where_stock_does_not():
    data = extreme_decay()
    half = [x.half() for x in data]
    out, state = call("R64+ec+dd", *half)
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    out, state = call("loop", *half)
    assert not (torch.isfinite(out).all() and torch.isfinite(state).all())


def test_safe_softplus():
    x = torch.linspace(-80, 80, 20001)
    ref = torch.log1p(torch.exp(x.double()))  # float64 truth at the same fp32 inputs
    ours = gated_delta.safe_softplus(x).double()
    assert ((ours - ref).abs() / ref.clamp_min(1e-30)).max() < 1e-6
    big = torch.tensor([12.0, 100.0, 60000.0], dtype=torch.float16)
    assert torch.isfinite(gated_delta.safe_softplus(big)).all()
    assert not torch.isfinite(torch.log1p(torch.exp(big))).all()  # the naive form overflows in fp16


def test_log1p_series_keeps_small_arguments_that_log_of_one_plus_y_rounds_away():
    """LiteRT runs torch.log1p as LOG(1 + y): a slow decay's softplus (~1e-5) loses ~1% in fp32 and
    everything in fp16. The series keeps it in both."""
    y = torch.tensor([1e-7, 1e-5, 3e-4, 0.1, 1.0])
    truth = torch.log1p(y.double())
    for dtype, bound, first in ((torch.float32, 1e-6, 0), (torch.float16, 2e-3, 1)):  # 1e-7 is below fp16
        series = gated_delta.log1p_series(y[first:].to(dtype)).double()
        assert ((series - truth[first:]).abs() / truth[first:]).max() < bound, dtype
    rounded = torch.log(1 + y[:2])  # the control: what LOG(1 + y) gives in fp32
    assert ((rounded.double() - truth[:2]).abs() / truth[:2]).max() > 1e-3
    assert (torch.log(1 + y[:3].half()) == 0).all()  # and in fp16


# --- the export graph ----------------------------------------------------------------------


class KernelModule(torch.nn.Module):
    def __init__(self, form):
        super().__init__()
        self.kernel = gated_delta.make_kernel(kernel_form.parse(form))

    def forward(self, q, k, v, g, beta, s0):
        return self.kernel(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)


def export_graph(form, length):
    args = inputs("strong_decay", length)
    return torch.export.export(KernelModule(form), args).graph


def ops(graph) -> list[str]:
    return [str(n.target) for n in graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("form", ["R64+sp+ec+dd+vs6", "R16+ec+dd", "R128+sp+ec+dd+vs6"])
def test_export_graph_rules(form):
    graph = export_graph(form, 130)
    ranks = [len(n.meta["val"].shape) for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert ranks and max(ranks) <= 4
    banned = ("eye", "arange", "triu", "tril", "cumsum", "masked_fill", "while", "scan", "index_put", "copy_")
    found = [op for op in ops(graph) if any(b in op for b in banned)]
    assert found == [], found


def test_cumsum_form_has_cumsum_and_dd_has_none():
    assert any("cumsum" in op for op in ops(export_graph("R64+ec", 64)))
    assert not any("cumsum" in op for op in ops(export_graph("R64+ec+dd", 64)))


def test_no_loop_over_rows_or_tokens():
    """At the same chunk count, chunk 128 costs a few more nodes than chunk 16 (log2 steps of the
    inverse), not ~8x more (a loop over rows); the loop form shows what a row loop costs."""
    small, large = len(ops(export_graph("R16+ec+dd", 64))), len(ops(export_graph("R128+ec+dd", 512)))
    assert large - small <= 3 * 8  # 3 more doubling steps of a few nodes each; a row loop would add 100s
    loop = len(ops(export_graph("loop", 256)))
    assert loop > 3 * len(ops(export_graph("R64+ec+dd", 256)))


# --- set_form / form_applied -----------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tiny_snapshot):
    from scripts.qwen35 import text_stack

    return text_stack.load_text_stack(tiny_snapshot, progress=False)[0]


def test_form_applied_switches_every_layer_and_restores_exactly(stack):
    x = torch.randn(1, 70, stack.config.hidden_size, generator=torch.Generator().manual_seed(0))
    layers = gated_delta.gated_deltanets(stack)
    before = [(m.chunk_gated_delta_rule, m.norm.variance_epsilon) for m in layers]
    with torch.no_grad():
        ref = stack(inputs_embeds=x, use_cache=False).last_hidden_state
        with gated_delta.form_applied(stack, "R64+sp+ec+dd+vs6") as changed:
            assert changed.layers == len(layers) == 6 and changed.norm_eps_scale == 4096
            assert changed.softplus == "not applied (stock class)"  # the stock class calls F.softplus
            assert all(m.chunk_gated_delta_rule.form == kernel_form.parse("R64+sp+ec+dd+vs6") for m in layers)
            assert all(m.norm.variance_epsilon == eps * 4096 for m, (_, eps) in zip(layers, before, strict=True))
            formed = stack(inputs_embeds=x, use_cache=False).last_hidden_state
        again = stack(inputs_embeds=x, use_cache=False).last_hidden_state
    assert [(m.chunk_gated_delta_rule, m.norm.variance_epsilon) for m in layers] == before
    assert torch.equal(again, ref)
    # The form took effect (other rounding), and changed nothing beyond rounding: the kernels agree to
    # ~3e-6 and 8 layers of std-0.2 weights amplify that to ~2e-5 of the final hidden state.
    assert not torch.equal(formed, ref)
    assert (formed - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_form_applied_restores_after_an_error(stack):
    layers = gated_delta.gated_deltanets(stack)
    before = [(m.chunk_gated_delta_rule, m.norm.variance_epsilon) for m in layers]
    with pytest.raises(RuntimeError, match="midway"):
        with gated_delta.form_applied(stack, "R32+dd+vs3"):
            raise RuntimeError("midway")
    assert [(m.chunk_gated_delta_rule, m.norm.variance_epsilon) for m in layers] == before


def test_a_second_form_replaces_the_first_without_compounding(stack):
    """set_form on a model that has a form: the norm eps is the stock one times the new 4^k, not
    times both forms' scales (the stock eps is recovered from the current kernel's form)."""
    layers = gated_delta.gated_deltanets(stack)
    stock = [m.norm.variance_epsilon for m in layers]
    with gated_delta.form_applied(stack, "R64+dd+vs6"):
        gated_delta.set_form(stack, "R64+dd+vs2")
        assert [m.norm.variance_epsilon for m in layers] == [e * 16 for e in stock]
        gated_delta.set_form(stack, "loop")
        assert [m.norm.variance_epsilon for m in layers] == stock
    assert [m.norm.variance_epsilon for m in layers] == stock


def test_the_form_s_softplus_travels_with_its_kernel():
    assert gated_delta.make_kernel(kernel_form.parse("R64+sp+dd")).softplus is gated_delta.safe_softplus
    assert gated_delta.make_kernel(kernel_form.parse("R64+dd")).softplus is F.softplus


def test_vs_leaves_the_layer_output_unchanged(stack):
    """vs6's 2^6 scale is absorbed by the gated norm (eps x 4^6): the GatedDeltaNet's output is the same."""
    layer = gated_delta.gated_deltanets(stack)[0]
    x = torch.randn(1, 70, stack.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with gated_delta.form_applied(stack, "R64+ec+dd"):
            plain = layer(x)
        with gated_delta.form_applied(stack, "R64+ec+dd+vs6"):
            scaled = layer(x)
    assert (scaled - plain).abs().max() <= 1e-6 * plain.abs().max()
