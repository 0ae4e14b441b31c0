"""scripts/litert/sections.py: a graph cut into sections computes exactly what the whole graph
computes; each section holds only the constants its ops read, within the limit; no cut carries a
tensor that is not float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from scripts.litert import cpu_graph, export, sections, tflite_file

WIDTH = 32
WEIGHT = WIDTH * WIDTH * 4


class Chain(torch.nn.Module):
    """Six Linears; the first three gated by a bool mask of `valid`, which crosses every boundary
    among them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lins = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(6))

    def forward(self, x, valid):
        mask = (valid > 0.5)[..., None]
        for i, lin in enumerate(self.lins):
            y = torch.tanh(lin(x))
            x = torch.where(mask, y, x) if i < 3 else y + x
        return {"y": x, "z": x.sum(-1)}


class Cpu:
    """A section compiled for LiteRT's CPU accelerator, with the interface SectionedGraph.run takes."""

    def __init__(self, path):
        self.graph = cpu_graph.CpuGraph(path)

    def signature(self, name=None):
        run = self.graph.get_signature_runner(name)
        return lambda **kw: {
            k: torch.from_numpy(v.copy()) for k, v in run(**{a: b.numpy() for a, b in kw.items()}).items()
        }

    def close(self):
        self.graph.close()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    path = tmp_path_factory.mktemp("sections") / "chain.tflite"
    x, valid = torch.randn(1, 8, WIDTH), torch.tensor([[1.0] * 5 + [0.0] * 3])
    export.convert(Chain().eval(), {"x": x, "valid": valid}, path)
    return path, {"x": x, "valid": valid}


def whole_graph(path, feeds):
    c = Cpu(path)
    try:
        return c.signature()(**feeds)
    finally:
        c.close()


def test_sections_compute_what_the_whole_graph_computes(chain):
    path, feeds = chain
    graph = sections.SectionedGraph(path, max_bytes=2 * WEIGHT + 1000)
    try:
        cut = graph.sections(export.DEFAULT_SIGNATURE)
        assert len(cut) >= 3
        second = {**feeds, "x": torch.randn(1, 8, WIDTH)}
        got = graph.run(Cpu, export.DEFAULT_SIGNATURE, [feeds, second])
    finally:
        graph.close()
    for out, f in zip(got, [feeds, second], strict=True):
        want = whole_graph(path, f)
        assert out.keys() == want.keys() and all(torch.equal(out[k], want[k]) for k in want)


def test_each_section_holds_its_own_constants_within_the_limit_and_crosses_in_float32(chain):
    path, _ = chain
    limit = 2 * WEIGHT + 1000
    graph = sections.SectionedGraph(path, max_bytes=limit)
    try:
        plan = graph.sections(export.DEFAULT_SIGNATURE)
        head = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
        tensors, ops = head.subgraphs[0].tensors, head.subgraphs[0].operators
        for s in plan:
            assert all(tensors[t].type == schema.TensorType.FLOAT32 for t in s.inputs + s.outputs), s
            # no cut carries a tensor one op of the section reads (see below); the graph's own outputs aside
            for t in set(s.outputs) - {int(t) for t in head.subgraphs[0].outputs}:
                assert sum(t in {int(i) for i in ops[j].inputs} for j in s.ops) != 1, (s, t)
            census = tflite_file.census(s.path)
            assert census["op_total"] == len(s.ops) and census["max_constant_bytes"] == 1024 * 4
        assert sum(len(s.ops) for s in plan) == len(ops)
        # the bool mask is live until the last gated op: no cut before it, so the first section holds
        # the three gated Linears (over the limit); every later section is within it
        selects = [i for i, op in enumerate(ops) if tflite_file.op_name(head, op) == "SELECT_V2"]
        assert len(selects) == 3 and selects[-1] in plan[0].ops and plan[0].constant_bytes > limit
        assert all(s.constant_bytes <= limit for s in plan[1:]) and len(plan) >= 3
    finally:
        graph.close()


def test_a_graph_within_the_limit_is_one_section_the_file_itself(chain):
    path, feeds = chain
    graph = sections.SectionedGraph(path, max_bytes=10 * 2**20)
    try:
        assert [s.path for s in graph.sections(export.DEFAULT_SIGNATURE)] == [path]
        got = graph.run(Cpu, export.DEFAULT_SIGNATURE, [feeds])[0]
    finally:
        graph.close()
    want = whole_graph(path, feeds)
    assert all(torch.equal(got[k], want[k]) for k in want)


def fake_model(ops: list[tuple[list[int], list[int]]], constants: dict[int, int], n_tensors: int):
    """A model object as plan_subgraph reads it: ops (inputs, outputs), constants {tensor: bytes}."""
    from types import SimpleNamespace as NS

    buffers = [NS(data=None, offset=0, size=0)] + [
        NS(data=np.zeros(b, np.uint8), offset=0, size=0) for b in constants.values()
    ]
    index = {t: i + 1 for i, t in enumerate(constants)}
    tensors = [NS(buffer=index.get(t, 0), type=schema.TensorType.FLOAT32) for t in range(n_tensors)]
    return NS(buffers=buffers, subgraphs=[NS(tensors=tensors, operators=[NS(inputs=i, outputs=o) for i, o in ops])])


def test_no_cut_where_a_crossing_tensor_has_one_reader_before_it():
    """x -> a (W1); b = f(a) (W2); c = g(a, b) (W3); d = h(c) (W4), 100-byte weights, limit 250: the cut
    within the limit (before c) would carry `a`, which b alone reads inside the section; the next cut
    is taken. With a second reader of `a` before the cut (e: another op on a), it is taken."""
    ops = [([0, 1], [10]), ([10, 2], [11]), ([10, 11, 3], [12]), ([12, 4], [13])]
    model = fake_model(ops, {1: 100, 2: 100, 3: 100, 4: 100}, 15)
    plan = sections.plan_subgraph(model, 0, [13], max_bytes=250)
    assert [(s.ops.start, s.ops.stop) for s in plan] == [(0, 3), (3, 4)]
    assert plan[0].outputs == [12] and plan[1].inputs == [12] and plan[0].constant_bytes == 300
    two = [([0, 1], [10]), ([10], [14]), ([10, 14, 2], [11]), ([10, 11, 3], [12]), ([12, 4], [13])]
    plan = sections.plan_subgraph(fake_model(two, {1: 100, 2: 100, 3: 100, 4: 100}, 15), 0, [13], max_bytes=250)
    assert [(s.ops.start, s.ops.stop) for s in plan] == [(0, 3), (3, 5)] and plan[0].outputs == [10, 11]


class ScaleThenLinear(torch.nn.Module):
    def __init__(self, readers: int):
        super().__init__()
        torch.manual_seed(0)
        self.scale = torch.nn.Parameter(torch.randn(1, 1, 128))
        self.lins = torch.nn.ModuleList(torch.nn.Linear(128, 32, bias=False) for _ in range(readers))

    def forward(self, x):
        scaled = x * self.scale
        return {"z": sum(lin(scaled) for lin in self.lins)}


@pytest.mark.slow  # the GPU accelerator
@pytest.mark.parametrize("readers", [1, 2])
def test_an_output_one_op_of_the_section_reads_is_left_unwritten_on_the_gpu(tmp_path, readers):
    """Why the planner takes no cut where a tensor that one op of the section reads would cross: the
    accelerator fuses the MUL into the FULLY_CONNECTED and never writes the MUL's output. Read by two
    FULLY_CONNECTEDs, it is written."""
    import mmap

    from scripts.litert import gpu_accelerator

    path, x = tmp_path / "g.tflite", torch.randn(1, 8, 128)
    module = ScaleThenLinear(readers).eval()
    export.convert(module, {"x": x}, path)
    head = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
    sg = head.subgraphs[0]
    assert [tflite_file.op_name(head, op) for op in sg.operators][:2] == ["MUL", "FULLY_CONNECTED"]
    scaled, z, x_in = int(sg.operators[0].outputs[0]), int(sg.outputs[0]), int(sg.inputs[0])
    section = sections.Section(range(len(sg.operators)), [x_in], [scaled, z], 0)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        sections.write(path, head, mm, 0, section, tmp_path / "s.tflite")
    feeds = {sections.tensor_name(x_in): x}
    want = whole_graph(tmp_path / "s.tflite", feeds)  # the CPU writes both
    got = gpu_accelerator.compile(tmp_path / "s.tflite", True).signature()(**feeds)
    name = sections.tensor_name(scaled)
    assert torch.allclose(want[name], x * module.scale.detach())
    assert torch.allclose(got[sections.tensor_name(z)], want[sections.tensor_name(z)], atol=1e-5)
    assert torch.allclose(got[name], want[name], atol=1e-5) == (readers == 2)  # one reader: unwritten
