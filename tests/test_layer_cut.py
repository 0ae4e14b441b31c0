"""scripts/litert/layer_cut.py: the ops before the cut after n decoder layers compute those layers,
and the tensor it names is the residual stream after them (torch's, to float32 rounding)."""

from __future__ import annotations

import mmap

import pytest
import torch
from ai_edge_litert.tools import flatbuffer_utils

from scripts.litert import cpu_graph, export, layer_cut, sections, tflite_file
from scripts.pipeline.errors import ClefError
from scripts.qwen35 import patch
from scripts.qwen35.host import Host
from scripts.qwen35.row_graph import ClefRowPrefill

L = 64


def first_layers(model, n: int):
    """The stack cut to its first n layers, without the final norm: its output is the residual stream."""
    model.layers = torch.nn.ModuleList(list(model.layers)[:n])
    model.norm = torch.nn.Identity()
    return model


@pytest.fixture(scope="module")
def row_graph(tiny_snapshot, tmp_path_factory):
    """The tiny stack's first hybrid block (three GatedDeltaNets, one attention layer) as a row graph."""
    model, _, _ = patch.load(tiny_snapshot, "R64+sp+ec+dd+vs6", progress=False)
    model.layers = torch.nn.ModuleList(list(model.layers)[:4])
    assert [layer.block_type for layer in model.layers][-1] == "full_attention"
    host = Host(tiny_snapshot)
    inputs = host.record(list(range(3, 3 + L - 9)), L)
    path = tmp_path_factory.mktemp("layer_cut") / "row.tflite"
    export.convert(ClefRowPrefill(model, L).eval(), inputs, path)
    return model, tiny_snapshot, inputs, path


def head(path):
    return flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))


def run_until(path, model_head, c: layer_cut.Cut, inputs: dict, tmp_path) -> torch.Tensor:
    sg = model_head.subgraphs[0]
    names = {tflite_file.text(sig.name): int(sig.tensorIndex) for sig in model_head.signatureDefs[0].inputs}
    reads = {int(t) for op in sg.operators[: c.stop] for t in op.inputs if t >= 0}
    ins = [t for name, t in names.items() if t in reads]
    section = sections.Section(range(c.stop), ins, [c.residual], 0)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        sections.write(path, model_head, mm, 0, section, tmp_path / "first.tflite")
    graph = cpu_graph.CpuGraph(tmp_path / "first.tflite")
    try:
        key = {t: k for k, t in names.items()}
        feed = {sections.tensor_name(t): inputs[key[t].removeprefix("serving_default_")].numpy() for t in ins}
        out = graph.get_signature_runner(None)(**feed)
    finally:
        graph.close()
    return torch.from_numpy(out[sections.tensor_name(c.residual)].copy())


@pytest.mark.slow  # converts a graph
def test_the_ops_before_the_cut_compute_the_first_layers_residual_stream(row_graph, tiny_snapshot, tmp_path):
    model, snapshot, inputs, path = row_graph
    graph_head = head(path)
    hidden = model.config.hidden_size
    assert layer_cut.cut(graph_head, 0, 4, hidden) is None  # no layer after the fourth: nothing to cut
    stops = []
    for n in (1, 3):
        c = layer_cut.cut(graph_head, 0, n, hidden)
        stops.append(c.stop)
        got = run_until(path, graph_head, c, inputs, tmp_path)
        fresh, _, _ = patch.load(snapshot, "R64+sp+ec+dd+vs6", progress=False)
        with torch.no_grad():
            want = ClefRowPrefill(first_layers(fresh, n), L).eval()(**inputs)["hidden"]
        err = float((got - want).abs().max() / want.abs().max())
        assert err < 1e-5, (n, err)
    assert 0 < stops[0] < stops[1] < len(graph_head.subgraphs[0].operators)


@pytest.mark.slow  # converts a graph
def test_a_graph_not_laid_out_layer_by_layer_is_refused(row_graph):
    """Names without layers, or not exactly one residual-wide activation across the cut: one line, no cut."""
    _, _, _, path = row_graph
    graph_head = head(path)
    sg = graph_head.subgraphs[0]
    with pytest.raises(ClefError, match="0 activations of width 2000000 cross the cut after layer 0"):
        layer_cut.cut(graph_head, 0, 1, 2 * 10**6)
    for tensor in sg.tensors:
        tensor.name = "anonymous"
    with pytest.raises(ClefError, match="no tensor names a decoder layer"):
        layer_cut.cut(graph_head, 0, 1, 8)


class Cpu:
    """A section on LiteRT's CPU accelerator, as SectionedGraph.run takes it."""

    def __init__(self, path):
        self.graph = cpu_graph.CpuGraph(path)

    def signature(self, name=None):
        run = self.graph.get_signature_runner(name)
        return lambda **kw: {
            k: torch.from_numpy(v.copy()) for k, v in run(**{a: b.numpy() for a, b in kw.items()}).items()
        }

    def close(self):
        self.graph.close()


@pytest.mark.slow  # converts a graph
def test_a_sectioned_graph_of_the_first_layers_gives_their_residual_and_names_the_op_kinds_it_leaves(
    row_graph, tiny_snapshot
):
    """Cut after one GatedDeltaNet: `hidden` is its residual stream, in sections; the attention layer's op
    kinds the cut leaves unrun are named (verify_gpu fails on them). Cut after the whole graph's layers:
    no cut, the whole graph."""
    model, snapshot, inputs, path = row_graph
    hidden = model.config.hidden_size
    graph = sections.SectionedGraph(path, 2**18, layers=1, hidden_size=hidden)
    try:
        p = graph.plans[export.DEFAULT_SIGNATURE]
        assert p.cut.layers == 1 and sum(len(s.ops) for s in p.sections) == p.cut.stop
        assert list(p.outputs) == ["hidden"] and "SOFTMAX" in p.unreached
        got = graph.run(Cpu, export.DEFAULT_SIGNATURE, [inputs])[0]["hidden"]
    finally:
        graph.close()
    fresh, _, _ = patch.load(snapshot, "R64+sp+ec+dd+vs6", progress=False)
    with torch.no_grad():
        want = ClefRowPrefill(first_layers(fresh, 1), L).eval()(**inputs)["hidden"]
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    whole = sections.SectionedGraph(path, 2**40, layers=4, hidden_size=hidden)
    try:
        p = whole.plans[export.DEFAULT_SIGNATURE]
        assert p.cut is None and p.unreached == [] and [s.path for s in p.sections] == [path]
    finally:
        whole.close()


def test_checked_layers_is_the_first_block_when_the_stack_has_more():
    from types import SimpleNamespace as NS

    from scripts.checks import gpu_check

    types = ["linear_attention"] * 3 + ["full_attention"]
    deep = NS(layer_types=types * 8, num_hidden_layers=32)
    one = NS(layer_types=types, num_hidden_layers=4)
    assert gpu_check.checked_layers("block", deep, "tiny") == 4
    assert gpu_check.checked_layers("block", one, "hub") is None  # the block is the whole stack
    assert gpu_check.checked_layers("all", deep, "hub") is None
    # auto: every layer of the tiny checkpoint, the first block of any other
    assert gpu_check.checked_layers("auto", deep, "tiny") is None
    assert gpu_check.checked_layers("auto", deep, "hub") == gpu_check.checked_layers("auto", deep, "synthetic") == 4


def test_residual_stream_makes_the_final_norm_the_identity_and_restores_it():
    from scripts.checks import gpu_check

    a, b = torch.nn.Module(), torch.nn.Module()
    norm_a, norm_b = torch.nn.LayerNorm(4), torch.nn.LayerNorm(4)
    a.norm, b.norm = norm_a, norm_b
    with pytest.raises(RuntimeError), gpu_check.residual_stream(a, b):
        assert isinstance(a.norm, torch.nn.Identity) and isinstance(b.norm, torch.nn.Identity)
        raise RuntimeError("restored on the way out")
    assert a.norm is norm_a and b.norm is norm_b
