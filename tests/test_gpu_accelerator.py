"""LiteRT's GPU accelerator: what it refuses is read from its own log and named; BROADCAST_TO and
aliased outputs fail the census gate at export and fail verify_gpu; a missing Vulkan adapter is one
line; the GPU checks fail on NaN, on an fp32 error over the bound, and on bad params."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from scripts.checks import compare, gpu_check, records
from scripts.layers import weight_precision
from scripts.litert import export, gpu_accelerator, sections, tflite_file
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host
from tests.conftest import ROOT, assert_one_line_error

LOG = "\n".join(
    [
        "INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0, enable_host_mapped_pointer=1)",
        "I0000 00:00:1796031338.4 2830 environment.cc:532] Selected adapter: llvmpipe (LLVM 15.0.6, 256 bits), "
        "arch=software, vendor=mesa, backend=Vulkan, adapterType=CPU / Software",
        "ERROR: Following operations are not supported by GPU delegate:",
        "BROADCAST_TO: Operation is not supported.",
        "RANDOM_OP: Not supported in this build.",
        "659 operations will run on the GPU, and the remaining 629 operations will run on the CPU.",
        "",
    ]
)


def test_refused_ops_and_adapter_are_read_from_the_log():
    assert gpu_accelerator.refused_ops(LOG) == [
        "BROADCAST_TO: Operation is not supported.",
        "RANDOM_OP: Not supported in this build.",
    ]
    assert gpu_accelerator.adapter_name(LOG) == "llvmpipe (LLVM 15.0.6, 256 bits)"
    assert gpu_accelerator.refused_ops("nothing refused") == [] and gpu_accelerator.adapter_name("") is None


def test_a_mode_proof_is_the_probe_record_verify_gpu_writes():
    """ModeProof is each mode's `probe` in verify_gpu's record: mode, probe_error, arithmetic, in that
    order, and it reads back to the same proof."""
    proof = gpu_accelerator.ModeProof("fp16", 1e-3, "fp16")
    assert proof.to_json() == {"mode": "fp16", "probe_error": 1e-3, "arithmetic": "fp16"}
    assert list(proof.to_json()) == ["mode", "probe_error", "arithmetic"]
    assert gpu_accelerator.ModeProof.from_json(proof.to_json(), "probe") == proof


class Toy(torch.nn.Module):
    def __init__(self, alias: bool = False, broadcast: bool = False):
        super().__init__()
        self.alias, self.broadcast = alias, broadcast

    def forward(self, x, valid):
        y = x @ x.transpose(-1, -2)
        if self.broadcast:  # an expand feeding a concatenation: the converter emits BROADCAST_TO
            y = torch.cat([y, valid[:, None, :].expand(1, 4, 4)], dim=-1)
        out = {"y": y, "z": x * 2.0}
        if self.alias:
            out["slots"] = valid
        return out


def toy_graph(tmp_path, name, **kw):
    path = tmp_path / f"{name}.tflite"
    export.convert(Toy(**kw).eval(), {"x": torch.randn(1, 4, 8), "valid": torch.ones(1, 4)}, path)
    return path


def test_a_clean_graph_runs_on_the_gpu_in_every_mode(tmp_path):
    path = toy_graph(tmp_path, "clean")
    x, valid = torch.randn(1, 4, 8), torch.ones(1, 4)
    for mode, bound in (("fp32", 1e-5), ("fp16", 5e-3), ("mixed", 5e-3)):
        c = gpu_accelerator.compile(path, mode)
        assert c.fully_accelerated and c.adapter
        out = c.signature()(x=x, valid=valid)
        assert compare.rel(out["y"], x @ x.transpose(-1, -2)) < bound


class RefusingRuntime:
    """A compiled model whose run logs a device validation error on fd 2 and raises, as LiteRT's does
    when the device refuses a dispatch (then reading an output fails to lock its buffer). A real
    refusal cannot be provoked safely: a wrongly sized input overruns the buffer it is written to."""

    class Buffer:
        def write(self, array):
            pass

    def get_signature_list(self):
        return {"serving_default": {"inputs": ["x"], "outputs": ["y"]}}

    def get_signature_index(self, key):
        return 0

    def get_output_tensor_details(self, key):
        return {"y": {"shape": [1, 4]}}

    def create_input_buffers(self, index):
        return [self.Buffer()]

    create_output_buffers = create_input_buffers

    def run_by_index(self, index, inputs, outputs):
        os.write(2, b"I dawn: ok\nW dawn: Validation error: Binding size (201326592) is larger than the maximum\n")
        raise RuntimeError("TensorBufferWrapper error: Failed to lock custom tensor buffer")


class SlowRuntime(RefusingRuntime):
    """A compiled model whose first `slow` runs outlast the accelerator's wait: reading their output
    fails to lock the buffer (which stays locked, as LiteRT's does); later runs are read."""

    def __init__(self, slow: int):
        self.slow, self.runs = slow, 0

    class Output:
        def __init__(self, late: bool):
            self.late, self.locked = late, False

        def read(self, n, dtype):
            if self.locked:
                raise RuntimeError("TensorBufferWrapper error: Tensor buffer is already locked.")
            self.locked = True
            if self.late:
                raise RuntimeError("TensorBufferWrapper error: code=7 Failed to lock custom tensor buffer.")
            return np.full(n, 2.0, dtype)

    def create_output_buffers(self, index):
        return [self.Output(self.runs < self.slow)]

    def run_by_index(self, index, inputs, outputs):
        assert not outputs[0].locked, "a run must get output buffers that were not locked"
        outputs[0].late = self.runs < self.slow
        self.runs += 1


def test_a_run_that_outlasts_the_accelerators_wait_is_run_again_on_fresh_buffers():
    """The accelerator waits about two minutes for a run's outputs (a first run on lavapipe compiles its
    shaders too): such a run is repeated on fresh output buffers, up to RUN_ATTEMPTS runs, then fails."""
    x = torch.zeros(1, 4).numpy()
    slow = SlowRuntime(gpu_accelerator.RUN_ATTEMPTS - 1)
    out = gpu_accelerator.signature_runner(slow, "graph.tflite", quiet_runs=True)(x=x)
    assert slow.runs == gpu_accelerator.RUN_ATTEMPTS and out["y"].tolist() == [[2.0] * 4]
    never = SlowRuntime(gpu_accelerator.RUN_ATTEMPTS)
    with pytest.raises(ClefError, match="graph.tflite \\[serving_default\\]: the run failed: .*Failed to lock"):
        gpu_accelerator.signature_runner(never, "graph.tflite", quiet_runs=True)(x=x)
    assert never.runs == gpu_accelerator.RUN_ATTEMPTS


def test_a_failed_run_is_one_line_naming_the_graph_signature_and_the_runtimes_reason():
    """A failed run is a ClefError naming the graph and signature with the device's reason from the
    runtime's log (captured, on every run with quiet_runs), not a bare RuntimeError with the log lost."""
    run = gpu_accelerator.signature_runner(RefusingRuntime(), "graph.tflite", quiet_runs=True)
    for _ in range(2):  # the first call and a later one
        with pytest.raises(ClefError) as info:
            run(x=torch.zeros(1, 4).numpy())
        assert str(info.value) == (
            "graph.tflite [serving_default]: the run failed: Binding size (201326592) is larger than the "
            "maximum; TensorBufferWrapper error: Failed to lock custom tensor buffer"
        )
    assert gpu_accelerator.run_failure("lock failed", "ERROR: [x.cc:1] out of memory\n") == (
        "ERROR: [x.cc:1] out of memory; lock failed"
    )
    assert gpu_accelerator.run_failure("lock failed", "") == "lock failed"


class Norm(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return {"y": self.norm(x)}


def test_rms_norm_survives_massive_activations_in_fp16_on_the_gpu(tmp_path):
    """A position with a channel at 2000: the stock RMSNorm's squares overflow fp16 on the accelerator
    (its x.float() is not a float32 there), and the position comes out zero; ClefRMSNorm keeps it."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    x = torch.randn(1, 4, 64)
    x[0, 1, 5] = 2000.0
    errors = {}
    for name, cls in (("stock", Qwen3_5RMSNorm), ("clef", patch.ClefRMSNorm)):
        norm = Qwen3_5RMSNorm(64)
        norm.__class__ = cls
        path = tmp_path / f"{name}.tflite"
        export.convert(Norm(norm).eval(), {"x": x}, path)
        out = gpu_accelerator.compile(path, "fp16").signature()(x=x)["y"]
        with torch.no_grad():
            errors[name] = compare.figures("vs_f64", out, Qwen3_5RMSNorm(64).double()(x.double()))
    assert errors["clef"]["rel_per_position_vs_f64"] < 5e-3, errors
    assert errors["stock"]["rel_per_position_vs_f64"] > 0.5, errors  # the control: the overflow


class Dense(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.linear = torch.nn.Linear(k, 256, bias=False)
        torch.nn.init.normal_(self.linear.weight, std=k**-0.5)

    def forward(self, x):
        return {"y": self.linear(x)}


def test_the_fp16_mode_error_grows_with_the_reduction_length(tmp_path):
    """Why the fp16 figures sit further above the floor at real width than on the tiny model: one
    FULLY_CONNECTED on the accelerator in fp16 mode drifts from float64 as its input width K grows
    (it accumulates in half precision), while torch float16, the floor (half storage, float32
    accumulation on the CPU), does not: the gap is the device's arithmetic, not the graph's."""
    torch.manual_seed(0)
    gpu, floor = {}, {}
    for k in (256, 4096):
        dense, x = Dense(k).eval(), torch.randn(1, 64, k)
        path = tmp_path / f"dense{k}.tflite"
        export.convert(dense, {"x": x}, path)
        c = gpu_accelerator.compile(path, "fp16")
        out = c.signature()(x=x)["y"]
        c.close()
        with torch.no_grad():
            exact = dense.double()(x.double())["y"]
            floor[k] = compare.rel(dense.half()(x.half())["y"], exact)
        gpu[k] = compare.rel(out, exact)
    assert gpu[4096] > 2 * gpu[256], gpu  # grows with K
    assert gpu[4096] > 10 * floor[4096] and floor[4096] < 2 * floor[256], (gpu, floor)  # the floor does not


def test_output_that_is_an_input_fails_the_census_gate_and_is_left_unwritten_on_the_gpu(tmp_path):
    """Why pair_graph computes its slots: the accelerator does not write an output that is an input."""
    path = toy_graph(tmp_path, "alias", alias=True)
    found = tflite_file.violations(tflite_file.census(path))
    assert any("slots = input valid" in v for v in found), found
    valid = torch.tensor([[1.0, 1.0, 0.5, 0.25]])
    out = gpu_accelerator.compile(path, "fp32").signature()(x=torch.randn(1, 4, 8), valid=valid)
    assert not torch.equal(out["slots"], valid), "the accelerator now passes inputs through: the rule can be relaxed"


class ChunkPad(torch.nn.Module):
    """The chunk kernel's padding of g to whole chunks, [1, 12, 4] -> chunk-major [2, 4, 8]: by PAD on a
    rank-3 view (as the kernel did), or by concatenating zeros (as it does)."""

    def __init__(self, pad_op: bool):
        super().__init__()
        self.pad_op = pad_op

    def forward(self, g):
        x = g.transpose(1, 2).reshape(4, 12, 1)
        x = torch.nn.functional.pad(x, (0, 0, 0, 4)) if self.pad_op else torch.cat([x, torch.zeros(4, 4, 1)], dim=1)
        return {"y": x.reshape(4, 2, 8).transpose(0, 1).contiguous() * 2.0}


def test_a_rank3_pad_fails_the_census_gate_and_computes_wrong_on_the_gpu(tmp_path):
    """Why the chunk kernel concatenates zeros: the accelerator takes a rank-3 PAD and gets it wrong."""
    g = torch.randn(1, 12, 4)
    errors = {}
    for pad_op in (True, False):
        path = tmp_path / f"pad_{pad_op}.tflite"
        export.convert(ChunkPad(pad_op).eval(), {"g": g}, path)
        found = tflite_file.violations(tflite_file.census(path))
        assert any("PAD x1 on a tensor of rank < 4" in v for v in found) == pad_op, found
        out = gpu_accelerator.compile(path, "fp32").signature()(g=g)["y"]
        errors[pad_op] = compare.rel(out, ChunkPad(pad_op)(g)["y"])
    assert errors[False] < 1e-6 and errors[True] > 0.1, errors


@pytest.fixture(scope="module")
def two_layer_model(tiny_snapshot):
    """The tiny stack cut to one GatedDeltaNet and one attention layer: a pair converts in seconds."""
    model, _, _ = patch.load(tiny_snapshot, "R64+sp+ec+dd+vs6", progress=False)
    kinds = [layer.block_type for layer in model.layers]
    model.layers = torch.nn.ModuleList(
        [model.layers[kinds.index("linear_attention")], model.layers[kinds.index("full_attention")]]
    )
    return model, Host(tiny_snapshot)


def convert_pair(model, host, path, P_=16, S=8):
    prefix = pair_graph.PairPrefix(model, P_).eval()
    suffix = pair_graph.PairSuffix(model, P_, S).eval()
    first = host.record([0], P_)
    with torch.no_grad():
        state = {k: v for k, v in prefix(**first).items() if k != "hidden"}
    export.convert_signatures(
        {"prefix": (prefix, first), "suffix": (suffix, {**host.record([0], S, start=1), **state})}, path
    )


@pytest.mark.slow  # converts a shared-state pair
def test_a_pair_broken_back_to_broadcast_to_fails_at_export_and_on_the_gpu(two_layer_model, tmp_path, monkeypatch):
    model, host = two_layer_model

    def expanded(past_slots, length):  # the pair's past mask as it was before verify_gpu found BROADCAST_TO
        return ((1.0 - past_slots) * pair_graph.MASKED)[:, None, None, :].expand(-1, 1, length, -1)

    monkeypatch.setattr(pair_graph, "past_mask", expanded)
    raw = tmp_path / "broken.raw"
    convert_pair(model, host, raw)
    census = tflite_file.census(raw)
    assert census["signatures"]["suffix"]["ops"].get("BROADCAST_TO") and not census["signatures"]["prefix"]["ops"].get(
        "BROADCAST_TO"
    )

    out = tmp_path / "pair.tflite"
    with pytest.raises(ClefError, match="census gate: op BROADCAST_TO"):
        export.write(out, raw, {"kind": "pair", "weights": "fp32"}, weight_precision.Applied("fp32", 0, 0, 0, 0.0))
    assert not out.exists()

    with pytest.raises(ClefError) as info:
        gpu_accelerator.compile(raw, "fp32", census)
    assert "first refused op BROADCAST_TO" in str(info.value) and "in signature suffix" in str(info.value), str(
        info.value
    )


@pytest.mark.slow  # converts a shared-state pair
def fc_weight_bytes(path) -> list[int]:
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    return [
        len(model.buffers[sg.tensors[op.inputs[1]].buffer].data)
        for sg in model.subgraphs
        for op in sg.operators
        if tflite_file.op_name(model, op) == "FULLY_CONNECTED"
    ]


@pytest.mark.parametrize("limit", [None, 2**14])
def test_the_pair_as_built_is_fully_accelerated_and_exact_in_fp32(two_layer_model, tmp_path, monkeypatch, limit):
    """P=16, S=8: both signatures pad their chunks, which a PAD op got wrong on the GPU. With the
    constant limit lowered to 16 KiB, the tiny MLP weights are split by rows: the blocks are shared by
    both signatures (the file does not grow) and the pair, run in sections on the GPU, is as exact."""
    model, host = two_layer_model
    path = tmp_path / "pair.tflite"
    if limit:
        convert_pair(model, host, tmp_path / "whole.tflite")
        monkeypatch.setattr(tflite_file, "MAX_CONSTANT_BYTES", limit)
    convert_pair(model, host, path)
    census = tflite_file.census(path)
    if limit:  # the kernel's 1 MiB 0/1 constant is over the lowered limit too: not a Linear, not split
        assert [v for v in tflite_file.violations(census) if "a constant of 1048576 bytes" not in v] == []
        whole = tflite_file.census(tmp_path / "whole.tflite")

        def over(p):  # the Linear weights over the limit (the kernel's constant is 1 MiB)
            return [b for b in fc_weight_bytes(p) if limit < b < 2**20]

        assert over(path) == [] and over(tmp_path / "whole.tflite") != []
        assert census["ops"]["FULLY_CONNECTED"] > whole["ops"]["FULLY_CONNECTED"]
    else:
        assert tflite_file.violations(census) == []
    if limit:
        growth = path.stat().st_size - (tmp_path / "whole.tflite").stat().st_size
        assert growth < 0.05 * path.stat().st_size, growth
    # sections: the file itself, or (with the limit lowered) 256 KiB of constants at a time
    graph = sections.SectionedGraph(path, 2**18 if limit else 2**40)
    assert {len(graph.sections(n)) > 1 for n in ("prefix", "suffix")} == {bool(limit)}
    runs = {mode: gpu_check.ModeRun(graph, mode, census) for mode in gpu_check.MODES}
    for run in runs.values():
        run.gate()
        assert run.fully_accelerated and run.device.adapter
    refs = gpu_check.signature_references(
        pair_graph.PairPrefix(model, 16).eval(),
        pair_graph.PairSuffix(model, 16, 8).eval(),
        host,
        16,
        8,
        list(range(3, 27)),
        12,
    )
    shapes = pair_graph.state_shapes(model, 16)
    rows = gpu_check.pair_rows({"fp32": runs["fp32"]}, host, refs, [], 16, 8, "R64+sp+ec+dd+vs6", shapes)
    graph.close()
    assert {r["signature"] for r in rows} == {"prefix", "suffix"}
    assert all(r["finite"] and r["rel_vs_torch"] < 1e-4 for r in rows), rows
    assert pair_graph.SLOTS in rows[0]["per_output"]  # every output is compared, the slots too


def test_the_pairs_first_layer_on_the_gpu_matches_torch_cut_to_that_layer(two_layer_model, tmp_path):
    """verify_gpu.layers at work on a pair: the signatures cut after their first layer (a GatedDeltaNet)
    give its residual stream and its state, and torch cut to that layer gives the same, the suffix fed
    torch's state and chaining from the GPU's own prefix."""
    model, host = two_layer_model
    P, S = 16, 8
    path = tmp_path / "pair.tflite"
    convert_pair(model, host, path)
    graph = sections.SectionedGraph(path, 2**40, layers=1, hidden_size=model.config.hidden_size)
    assert {n: p.cut.layers for n, p in graph.plans.items()} == {"prefix": 1, "suffix": 1}
    assert sorted(graph.plans["prefix"].outputs) == ["attn_slots", "gdn0_conv", "gdn0_recurrent", "hidden"]
    first = copy.copy(model)  # the same weights, the stack cut to the GatedDeltaNet
    first.layers = torch.nn.ModuleList(list(model.layers)[:1])
    first.config = copy.deepcopy(model.config)
    first.config.num_hidden_layers, first.config.layer_types = 1, ["linear_attention"]
    stock = gpu_check.StockReferences(first)
    with gpu_check.residual_stream(first, stock.twin):
        refs = gpu_check.signature_references(
            pair_graph.PairPrefix(first, P).eval(),
            pair_graph.PairSuffix(first, P, S).eval(),
            host,
            P,
            S,
            list(range(3, 3 + P + S)),
            12,
        )
        tokens = {p: [(5 * i + p) % 90 + 3 for i in range(p + S)] for p in records.chaining_lengths(P, S)[0]}
        chaining = gpu_check.chaining_references(first, host, stock, P, S, tokens)
        shapes = pair_graph.state_shapes(first, P)
    run = gpu_check.ModeRun(graph, "fp32", tflite_file.census(path))
    rows = gpu_check.pair_rows({"fp32": run}, host, refs, chaining, P, S, "R64+sp+ec+dd+vs6", shapes)
    graph.close()
    assert run.fully_accelerated and len(rows) == 2 + len(chaining)
    assert set(rows[0]["per_output"]) == {"hidden", "gdn0_conv", "gdn0_recurrent", "attn_slots"}
    assert all(r["finite"] and r["rel_vs_torch"] < 1e-4 for r in rows), rows


@pytest.mark.parametrize("subset", [False, True])
def test_pair_rows_run_each_prefix_once_and_the_signature_prefix_is_a_chaining_prefix(two_layer_model, subset):
    """The GPU check of a pair in two batches per mode: the distinct prefixes (the last one is also
    the prefix signature's check), then one suffix per prefix (the shorter chaining suffixes are its
    head) and the suffix signature's. Torch stands in for the GPU: the signature rows
    are then exact, and the chaining rows as close to the row graph as the torch pair is. With every
    prefix of the CPU check and with the stage's GPU subset (one half-padded prefix)."""
    model, host = two_layer_model
    P, S = 16, 8
    prefix, suffix = pair_graph.PairPrefix(model, P).eval(), pair_graph.PairSuffix(model, P, S).eval()
    prefixes, suffixes = records.chaining_lengths(P, S)
    if subset:
        prefixes = gpu_check.chaining_prefixes(P)
        assert prefixes == [P // 2]
    tokens = {p: [(7 * i + p) % 100 + 3 for i in range(p + S)] for p in prefixes}

    class NoStock:  # the fp16 references are not used by an fp32 run
        def hidden(self, embeds):
            return (torch.zeros(embeds.shape[1], embeds.shape[2]),) * 2

    last = prefixes[-1]
    signature = gpu_check.signature_references(prefix, suffix, host, P, S, tokens[last], last)
    chaining = gpu_check.chaining_references(model, host, NoStock(), P, S, tokens)
    batches = []

    def torch_run(name, feeds):
        batches.append((name, len(feeds)))
        with torch.no_grad():
            return [dict((prefix if name == "prefix" else suffix)(**feed)) for feed in feeds]

    shapes = pair_graph.state_shapes(model, P)
    rows = gpu_check.pair_rows({"fp32": torch_run}, host, signature, chaining, P, S, "R64+sp+ec+dd+vs6", shapes)
    assert batches == [("prefix", len(prefixes)), ("suffix", len(prefixes) + 1)]
    assert [(r["signature"], r["rel_vs_torch"]) for r in rows if r["check"] == "signature"] == [
        ("prefix", 0.0),
        ("suffix", 0.0),
    ]
    chained = [r for r in rows if r["check"] == "chaining"]
    assert {(r["p"], r["s"]) for r in chained} == {(p, s) for p in prefixes for s in suffixes}
    assert all(r["finite"] for r in chained) and max(r["rel_vs_torch"] for r in chained) < 1e-5, chained
    # a short suffix whose tokens are not the head of the long one's cannot be read off its run
    chaining[0] = dataclasses.replace(chaining[0], ids=chaining[0].ids[:-1] + [chaining[0].ids[-1] + 1])
    with pytest.raises(ValueError, match="not the head of its longest suffix"):
        gpu_check.pair_rows({"fp32": torch_run}, host, signature, chaining, P, S, "R64+sp+ec+dd+vs6", shapes)


SECTION = {"max_rel_fp32": 1e-4, "max_rel_per_position_fp32": 1e-4, "fp16_max_over_floor": 2.0}
BOUNDS = gpu_check.GpuBounds(**SECTION)


def row(mode, rel_torch, finite=True, fp16=0.02, floor=0.01, per_position=None, half_per_position=None):
    r = {
        "mode": mode,
        "record": "full",
        "finite": finite,
        "rel_vs_torch": rel_torch,
        "rel_per_position_vs_torch": rel_torch if per_position is None else per_position,
    }
    if mode in gpu_check.HALF_MODES:
        pp = fp16 if half_per_position is None else half_per_position
        r.update(
            {
                "rel_vs_f64": fp16,
                "rel_per_position_vs_f64": pp,
                "rel_floor_vs_f64": floor,
                "rel_per_position_floor_vs_f64": floor,
                "over_floor": gpu_check.ratio(fp16, floor),
                "over_floor_per_position": gpu_check.ratio(pp, floor),
            }
        )
    return r


def test_summary_fails_on_nan_non_finite_and_fp32_over_a_bound():
    ok, problems = gpu_check.summary([row("fp32", 1e-6), row("fp16", 0.02), row("mixed", 1e-6, fp16=0.015)], BOUNDS)
    assert problems == [] and ok["fp16_over_floor"] == pytest.approx(2.0) and ok["fp16_within_target"]
    assert ok["modes"]["mixed"]["over_floor"] == pytest.approx(1.5) and not ok["modes"]["mixed"]["enforced"]
    _, problems = gpu_check.summary([row("fp32", float("nan")), row("fp16", 0.02)], BOUNDS)
    assert problems and "rel_vs_torch is nan" in problems[0]
    _, problems = gpu_check.summary([row("fp32", 2e-4, per_position=1e-5), row("fp16", 0.02, finite=False)], BOUNDS)
    assert len(problems) == 2 and any("not finite" in p for p in problems)
    _, problems = gpu_check.summary([row("fp32", 1e-6, per_position=3e-4), row("fp16", 0.02)], BOUNDS)
    assert problems == ["mode=fp32, record=full: rel_per_position_vs_torch 0.0003 > 0.0001"]


def test_the_picture_curves_are_each_modes_at_the_reference_records_shape():
    """A row's padded record, a pair's longest chaining suffix: fp32 against torch, the half modes and the
    floor against float64, one figure a position (scripts/pipeline/pictures.py draws them)."""

    def curve(r, **lists):
        return {**r, **{f"per_position_{k}": v for k, v in lists.items()}}

    rows = [
        curve({**row("fp32", 1e-6), "n_real": 2}, vs_torch=[1e-6, 2e-6]),
        curve({**row("fp16", 1e-6), "n_real": 2}, vs_torch=[0.1, 0.1], vs_f64=[0.03, 0.02], floor_vs_f64=[0.01, 0.01]),
    ]
    doc, _ = gpu_check.summary(rows, BOUNDS)
    assert doc["positions"] == {
        "record": "full (2 real)",
        "fp32_vs_torch": [1e-6, 2e-6],
        "fp16_vs_f64": [0.03, 0.02],
        "floor_vs_f64": [0.01, 0.01],
    }
    chained = [
        {"mode": "fp32", "check": "signature", "signature": "suffix"},
        curve({"mode": "fp32", "check": "chaining", "p": 32, "s": 1}, vs_torch=[9.0]),
        curve({"mode": "fp32", "check": "chaining", "p": 32, "s": 64}, vs_torch=[1.0, 2.0]),
    ]
    assert gpu_check.position_curves(chained) == {"record": "p=32, s=64", "fp32_vs_torch": [1.0, 2.0]}
    assert gpu_check.position_curves([row("fp32", 1e-6)]) is None  # rows without curves: nothing to draw


def test_a_mode_held_to_the_floor_fails_over_it_globally_or_per_position_and_the_others_are_recorded():
    """A half mode in verify_gpu.held_to_floor over fp16_max_over_floor x the floor, globally or at its
    worst position, or NaN, is a problem; a mode not held (fp16 here, 10x over) is recorded with
    within_target false, not a failure."""
    base = [row("fp32", 1e-6), row("fp16", 1e-6, fp16=0.2)]
    BOUNDS = dataclasses.replace(globals()["BOUNDS"], held_to_floor=("mixed",))
    doc, problems = gpu_check.summary([*base, row("mixed", 1e-6, fp16=0.015)], BOUNDS)
    assert doc["modes"]["mixed"]["enforced"] and not doc["modes"]["fp16"]["enforced"]
    assert problems == [] and doc["fp16_within_target"] is False and doc["modes"]["fp16"]["over_floor"] == 20
    _, problems = gpu_check.summary([*base, row("mixed", 1e-6, fp16=0.025, half_per_position=0.015)], BOUNDS)
    assert problems == ["mode=mixed, record=full: over_floor 2.5 > 2"]
    _, problems = gpu_check.summary([*base, row("mixed", 1e-6, fp16=0.015, half_per_position=0.03)], BOUNDS)
    assert problems == ["mode=mixed, record=full: over_floor_per_position 3 > 2"]
    _, problems = gpu_check.summary([*base, row("mixed", 1e-6, fp16=float("nan"))], BOUNDS)
    assert problems and "over_floor is nan" in problems[0]


@pytest.mark.parametrize(
    "section, fragment",
    [
        ({**SECTION, "max_rel_fp32": "x"}, "verify_gpu.max_rel_fp32 'x'"),
        ({**SECTION, "max_rel_fp32": -1e-4}, "verify_gpu.max_rel_fp32 -0.0001"),
        ({**SECTION, "fp16_max_over_floor": float("nan")}, "verify_gpu.fp16_max_over_floor nan"),
        ({"max_rel_fp32": 1e-4, "max_rel_per_position_fp32": 1e-4}, "verify_gpu.fp16_max_over_floor None"),
        ([1], "must be a mapping"),
    ],
)
def test_bad_gpu_params_refused(section, fragment):
    with pytest.raises(ClefError, match="params.yaml") as info:
        gpu_check.limits(section)
    assert fragment in str(info.value)


def test_gpu_params_are_read_into_their_bounds():
    assert gpu_check.limits(SECTION) == BOUNDS and BOUNDS.held_to_floor == ()
    held = gpu_check.limits({**SECTION, "held_to_floor": ["mixed"]})
    assert held == dataclasses.replace(BOUNDS, held_to_floor=("mixed",))


def test_sections_shrink_with_the_tokens_a_run_takes():
    """Memory bounds a section by a fraction of the stack, time by bytes x tokens: the accelerator waits
    about two minutes for a run, which a real-width section of 807 MB at L=256 outlasted on lavapipe."""
    stack = 3_459_797_248  # the real-width synthetic stack
    section = {"section_fraction": 0.25, "section_min_bytes": 2**28, "section_work": 1e11}
    assert gpu_check.section_bytes(section, stack, 64) == int(0.25 * stack)  # memory binds
    assert gpu_check.section_bytes(section, stack, 256) == int(1e11 / 256) < 0.5 * 0.25 * stack  # time binds
    assert gpu_check.section_bytes(section, 5_695_936, 256) == 2**28  # the tiny stack: it runs whole
    assert gpu_check.section_bytes({**section, "section_work": 1e9}, 5_695_936, 256) == int(1e9 / 256)
    for bad, fragment in (
        ({"section_fraction": 0.25, "section_min_bytes": 1}, "verify_gpu.section_work None"),
        ({"section_fraction": 0.25, "section_work": 1e11}, "verify_gpu.section_min_bytes None"),
        ([1], "section_fraction"),
    ):
        with pytest.raises(ClefError, match=fragment):
            gpu_check.section_bytes(bad, stack, 64)


def run_verify_gpu(workdir, *args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "stages.verify_gpu", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_no_vulkan_adapter_is_one_line_and_writes_nothing(workdir, tmp_path):
    graph = workdir / "artifacts" / "rows" / "row_L64.tflite"
    graph.parent.mkdir(parents=True)
    graph.write_bytes(toy_graph(tmp_path, "clean").read_bytes())
    (workdir / "results" / "stack.json").write_text('{"fp32_bytes": 1000000}')  # sizes the GPU sections
    # the toy graph has no decoder layers to cut the first block at: the accelerator runs all of it
    params = workdir / "params.yaml"
    params.write_text(params.read_text().replace("\n  layers: auto\n", "\n  layers: all\n"))
    assert "\n  layers: all\n" in params.read_text()
    proc = run_verify_gpu(
        workdir,
        "--length",
        "64",
        env_extra={"VK_ICD_FILENAMES": "/nonexistent.json", "VK_DRIVER_FILES": "/nonexistent.json"},
    )
    assert_one_line_error(proc, "no Vulkan adapter", "mesa-vulkan-drivers")
    assert not (workdir / "results" / "gpu").exists() and not (workdir / "results" / "metrics").exists()


def test_verify_gpu_refuses_a_graph_with_broadcast_to_before_the_gpu(workdir, tmp_path):
    graph = workdir / "artifacts" / "pairs" / "pair_P64_S64.tflite"
    graph.parent.mkdir(parents=True)
    graph.write_bytes(toy_graph(tmp_path, "broadcast", broadcast=True).read_bytes())
    proc = run_verify_gpu(workdir, "--prefix", "64", "--suffix", "64")
    assert_one_line_error(proc, "pair_P64_S64.tflite", "census gate", "BROADCAST_TO")
    assert not (workdir / "results" / "gpu").exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((), "--length L (a row graph) or --prefix P --suffix S"),
        (("--length", "64", "--prefix", "64", "--suffix", "64"), "--length L (a row graph) or"),
        (("--length", "64"), "run the export@64 stage first"),
    ],
)
def test_verify_gpu_bad_arguments(workdir, args, fragment):
    assert_one_line_error(run_verify_gpu(workdir, *args), fragment)


class Wide(torch.nn.Module):
    """One Linear whose fp32 weight is a row over WebGPU's 128 MiB storage-buffer binding limit."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4096, tflite_file.MAX_CONSTANT_BYTES // (4 * 4096) + 1, bias=False)

    def forward(self, x):
        return {"y": self.proj(x)}


@pytest.mark.slow  # converts and compiles a 128 MiB weight twice
def test_a_weight_over_the_binding_limit_is_split_at_export_and_refused_unsplit(tmp_path, monkeypatch):
    """Why the export splits large Linears: unsplit, the census gate fails the graph, and the accelerator
    logs a WebGPU validation error while computing the FULLY_CONNECTED wrong in fp32 (rel error 1 here)."""
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator

    torch.manual_seed(0)
    module, x = Wide().eval(), torch.randn(1, 8, 4096)
    with torch.no_grad():
        want = module(x)["y"]
    split = tmp_path / "split.tflite"
    export.convert(module, {"x": x}, split)
    c = tflite_file.census(split)
    assert c["ops"]["FULLY_CONNECTED"] == 2 and tflite_file.violations(c) == []
    assert compare.rel(gpu_accelerator.compile(split, "fp32").signature()(x=x)["y"], want) < 1e-5

    whole = tmp_path / "whole.tflite"
    monkeypatch.setattr(tflite_file, "MAX_CONSTANT_BYTES", 2 * tflite_file.MAX_CONSTANT_BYTES)
    export.convert(module, {"x": x}, whole)  # the split switched off
    monkeypatch.undo()
    found = tflite_file.violations(tflite_file.census(whole))
    assert any("134234112 bytes (> 134217728" in v for v in found), found
    with pytest.raises(ClefError, match="larger than the maximum storage buffer binding size"):
        gpu_accelerator.compile(whole, "fp32")
    model, log, _ = gpu_accelerator.load(whole, HardwareAccelerator.GPU, fp32=True)  # what compile refuses:
    out = gpu_accelerator.signature_runner(model, whole, quiet_runs=True)(x=x.numpy())["y"]
    assert compare.rel(torch.from_numpy(out), want) > 0.5  # the wrong result it would have given


def test_the_half_figures_and_a_signature_row_keep_their_keys_in_order():
    """gpu_check's typed pieces of a row write the keys, in the order, its dicts had."""
    exact = torch.ones(3, 4, dtype=torch.float64)
    half = gpu_check.half_figures(exact * 1.02, exact, exact * 1.01).to_json()
    assert list(half) == [
        "rel_vs_f64",
        "rel_per_position_vs_f64",
        "per_position_vs_f64",
        "rel_floor_vs_f64",
        "rel_per_position_floor_vs_f64",
        "per_position_floor_vs_f64",
        "over_floor",
        "over_floor_per_position",
    ]
    assert half["over_floor"] == pytest.approx(2.0) and len(half["per_position_floor_vs_f64"]) == 3
    outs = {"hidden": torch.ones(1, 4, 8), "gdn0_recurrent": torch.ones(1, 2, 4, 4)}
    ref = {"hidden": torch.ones(1, 4, 8), "gdn0_recurrent": 2 * torch.ones(1, 2, 4, 4)}
    sig = gpu_check._signature_row("fp32", "prefix", 32, outs, ref).to_json()
    assert list(sig) == [
        "mode",
        "check",
        "signature",
        "p",
        "finite",
        "rel_vs_torch",
        "rel_per_position_vs_torch",
        "per_output",
    ]
    assert sig["rel_vs_torch"] == 0.5 and list(sig["per_output"]) == ["hidden", "gdn0_recurrent"]
