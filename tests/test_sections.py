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
from scripts.pipeline.errors import ClefError

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
            census = tflite_file.census(s.path)
            assert census["op_total"] >= len(s.ops) and census["max_constant_bytes"] == 1024 * 4
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


def test_sections_cut_where_asked_compute_the_whole_graph_and_refuse_a_cut_through_the_bool_mask(chain):
    """cuts= (the trace of scripts/bench/gpu_mixed.py): sections at the given op indices compute what the
    whole graph computes; a cut while the bool mask is live is one ClefError naming the tensor."""
    path, feeds = chain
    head = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
    ops = head.subgraphs[0].operators
    selects = [i for i, op in enumerate(ops) if tflite_file.op_name(head, op) == "SELECT_V2"]
    cuts = [0, selects[-1] + 1, selects[-1] + 3, len(ops)]
    graph = sections.SectionedGraph(path, max_bytes=1, cuts={export.DEFAULT_SIGNATURE: cuts})
    try:
        assert [(s.ops.start, s.ops.stop) for s in graph.sections(export.DEFAULT_SIGNATURE)] == list(
            zip(cuts, cuts[1:], strict=False)
        )
        got = graph.run(Cpu, export.DEFAULT_SIGNATURE, [feeds])[0]
    finally:
        graph.close()
    want = whole_graph(path, feeds)
    assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ClefError, match=r"a cut at op \d+ or \d+ carries .*, not float32"):
        sections.SectionedGraph(path, max_bytes=1, cuts={export.DEFAULT_SIGNATURE: [0, selects[0], len(ops)]})


def fake_model(ops: list[tuple[list[int], list[int]]], constants: dict[int, int], n_tensors: int):
    """A model object as plan_subgraph reads it: ops (inputs, outputs), constants {tensor: bytes}."""
    from types import SimpleNamespace as NS

    buffers = [NS(data=None, offset=0, size=0)] + [
        NS(data=np.zeros(b, np.uint8), offset=0, size=0) for b in constants.values()
    ]
    index = {t: i + 1 for i, t in enumerate(constants)}
    tensors = [NS(buffer=index.get(t, 0), type=schema.TensorType.FLOAT32) for t in range(n_tensors)]
    return NS(buffers=buffers, subgraphs=[NS(tensors=tensors, operators=[NS(inputs=i, outputs=o) for i, o in ops])])


def test_a_cut_carries_a_tensor_one_op_before_it_reads_and_the_section_writes_it_through_a_copy(tmp_path):
    """x -> a (W1); b = f(a) (W2); c = g(a, b) (W3); d = h(c) (W4), 100-byte weights, limit 250: the cut
    within the limit (before c) carries `a`, which b alone reads inside the first section, so that section
    sends `a` out through a MUL(a, 1.0) copy; `b` is read by no op of its section and goes out as it is."""
    ops = [([0, 1], [10]), ([10, 2], [11]), ([10, 11, 3], [12]), ([12, 4], [13])]
    model = fake_model(ops, {1: 100, 2: 100, 3: 100, 4: 100}, 15)
    plan = sections.plan_subgraph(model, 0, [13], max_bytes=250)
    assert [(s.ops.start, s.ops.stop) for s in plan] == [(0, 2), (2, 4)]
    assert plan[0].outputs == [10, 11] and plan[1].inputs == [10, 11] and plan[0].constant_bytes == 200


def test_a_section_output_with_one_reader_inside_leaves_through_an_exact_copy(chain, tmp_path):
    path, feeds = chain
    graph = sections.SectionedGraph(path, max_bytes=2 * WEIGHT + 1000)
    try:
        head = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
        ops = head.subgraphs[0].operators
        copied = 0
        for s in graph.sections(export.DEFAULT_SIGNATURE):
            section = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(s.path)))
            sub = section.subgraphs[0]
            names = [tflite_file.op_name(section, op) for op in sub.operators]
            single = [t for t in s.outputs if sum(t in {int(i) for i in ops[j].inputs} for j in s.ops) == 1]
            # one MUL(t, 1.0) per such output, after the section's own ops, and the signature names it t<index>
            assert names[: len(s.ops)] == [tflite_file.op_name(head, ops[j]) for j in s.ops]
            assert names[len(s.ops) :] == ["MUL"] * len(single)
            for op in sub.operators[len(s.ops) :]:
                one = section.buffers[sub.tensors[op.inputs[1]].buffer].data.tobytes()
                assert one == np.float32(1.0).tobytes() and int(op.outputs[0]) in {int(t) for t in sub.outputs}
            copied += len(single)
        assert copied  # the chain has such outputs at these cuts
    finally:
        graph.close()


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
@pytest.mark.parametrize("readers, copy", [(1, False), (2, False), (1, True)])
def test_an_output_one_op_of_the_section_reads_is_written_on_the_gpu_only_through_a_copy(
    tmp_path, monkeypatch, readers, copy
):
    """Why write() sends such an output through a copy: the accelerator fuses the MUL into the
    FULLY_CONNECTED and never writes the MUL's output, though the section lists it. Read by two
    FULLY_CONNECTEDs, it is written; with the MUL-by-one copy (a second reader), it is written too."""
    import mmap

    from scripts.litert import gpu_accelerator

    if not copy:
        monkeypatch.setattr(sections, "_copy", lambda model, sub, tensor: tensor)
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
    got = gpu_accelerator.compile(tmp_path / "s.tflite", "fp32").signature()(**feeds)
    name = sections.tensor_name(scaled)
    assert torch.allclose(want[name], x * module.scale.detach())
    assert torch.allclose(got[sections.tensor_name(z)], want[sections.tensor_name(z)], atol=1e-5)
    assert torch.allclose(got[name], want[name], atol=1e-5) == (readers == 2 or copy)


def test_the_gpu_check_compiles_the_smallest_section_to_gate_and_each_section_once_per_batch(chain, monkeypatch):
    """verify_gpu's compiles, most of its time on a software GPU: the gate compiles one section (the
    smallest: an adapter check before any torch work), a run compiles each section once for its batch.
    The CPU stands in for the accelerator."""
    from scripts.checks import gpu_check
    from scripts.litert import gpu_accelerator

    path, feeds = chain
    compiled = []

    def compile_on_cpu(p, mode, census=None):
        compiled.append(p)
        c = Cpu(p)
        c.fully_accelerated = True
        return c

    monkeypatch.setattr(gpu_accelerator, "compile", compile_on_cpu)
    monkeypatch.setattr(gpu_accelerator, "device", lambda c: {"adapter": "cpu"})
    monkeypatch.setattr(gpu_accelerator, "prove_mode", lambda mode: gpu_accelerator.ModeProof(mode, 0.0, mode))
    graph = sections.SectionedGraph(path, max_bytes=2 * WEIGHT + 1000)
    try:
        cut = graph.sections(export.DEFAULT_SIGNATURE)
        run = gpu_check.ModeRun(graph, "fp32")
        run.gate()
        assert compiled == [min(cut, key=lambda s: s.constant_bytes).path] and len(cut) >= 3
        compiled.clear()
        got = run(export.DEFAULT_SIGNATURE, [feeds, {**feeds, "x": torch.randn(1, 8, WIDTH)}])
        assert compiled == [s.path for s in cut] and len(got) == 2
    finally:
        graph.close()
