"""A `.tflite` graph cut into sections, run one section at a time: the graph's own ops and weights,
for an accelerator that cannot hold the whole graph.

LiteRT's GPU accelerator holds several times a graph's weights while it compiles it (on lavapipe,
the software Vulkan driver, the GPU's memory is the host's: docs/real-width.md, "Memory"), so a real-width graph
does not fit where its CPU checks do. `plan` cuts each signature's ops, in their order, into
sections whose constants stay under a byte limit, each cut placed where the fewest tensors cross;
no cut carries a tensor that is not float32 (the runner feeds and reads float32). `write` makes a
section a model of its own: the section's ops, exactly the constants they read (copied from the
graph file), and as inputs and outputs the tensors that cross its edges (named `t<index>` after the
tensor in the graph). An output that a single op of the section reads leaves through a copy
(`MUL(t, 1.0)`): the accelerator fuses a tensor with one reader into that reader and never writes
it, though the model lists it as an output; with a second reader it is written. `SectionedGraph.run`
feeds a batch of inputs through the sections in order, compiling one section at a time and keeping
only the crossing tensors, so what it computes is what the whole graph computes, op for op.
"""

from __future__ import annotations

import copy
import itertools
import mmap
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from scripts.litert import layer_cut, tflite_file
from scripts.pipeline.errors import ClefError

PLACEHOLDER_OFFSET = 1 << 40  # a non-default offset, so the trial head has the final head's length


def tensor_name(index: int) -> str:
    return f"t{index}"


def _constants(model) -> dict[int, int]:
    """{buffer index: bytes} of every buffer that holds data (inline or external)."""
    sizes = enumerate(tflite_file.buffer_bytes(b) for b in model.buffers or [])
    return {i: size for i, size in sizes if size}


@dataclass
class Section:
    ops: range
    inputs: list[int]  # tensor indices in the graph's subgraph
    outputs: list[int]
    constant_bytes: int  # as the accelerator holds them: a stored fp16 or int8 weight at float32 (_held_bytes)
    path: Path | None = None


@dataclass
class SignaturePlan:
    name: str
    subgraph: int
    inputs: dict[str, int]  # signature name -> tensor index
    outputs: dict[str, int]
    sections: list[Section] = field(default_factory=list)
    cut: layer_cut.Cut | None = None  # where the plan stops, when it stops before the graph's end
    unreached: list[str] = field(default_factory=list)  # op kinds only after the cut


# bytes per element of a weight's stored type (scripts/litert/weight_storage.py); the accelerator expands it
# how many times its stored bytes a weight read by a DEQUANTIZE takes once expanded to float32
_EXPANSION = {schema.TensorType.FLOAT16: 2, schema.TensorType.INT8: 4, schema.TensorType.INT4: 8}


def _held_bytes(model, sg) -> dict[int, int]:
    """{tensor index: bytes} of every constant of subgraph `sg` as the accelerator holds it: a weight stored
    at a lower precision and read by a DEQUANTIZE counts at float32 (the accelerator expands it; cut by its
    stored bytes, an fp16 graph's sections held twice the weights they were sized for), every other
    constant at its stored bytes."""
    const = _constants(model)
    held = {t: const.get(tensor.buffer, 0) for t, tensor in enumerate(sg.tensors)}
    for op in sg.operators:
        reads = _reads(op)
        if reads and held[reads[0]] and tflite_file.op_name(model, op) == "DEQUANTIZE":
            grows = _EXPANSION.get(sg.tensors[reads[0]].type)
            if grows:
                held[reads[0]] = held[reads[0]] * grows
    return held


def _reads(op) -> list[int]:
    return [int(t) for t in (op.inputs if op.inputs is not None else []) if t >= 0]


def _writes(op) -> list[int]:
    return [int(t) for t in (op.outputs if op.outputs is not None else []) if t >= 0]


def plan_subgraph(model, sg_index: int, outputs: list[int], max_bytes: int, stop: int | None = None) -> list[Section]:
    """Cut subgraph `sg_index` (its ops before `stop`, all by default) into sections whose constants, as
    the accelerator holds them (_held_bytes), are each <= max_bytes where possible (an op whose own
    constants are larger gets a section alone); each cut, among the boundaries that keep the section
    within the limit, is where the fewest tensors cross."""
    sg = model.subgraphs[sg_index]
    tensor_bytes = _held_bytes(model, sg)
    ops = sg.operators[:stop]
    n = len(ops)
    produced = {t: i for i, op in enumerate(ops) for t in _writes(op)}
    last_read = {}
    for i, op in enumerate(ops):
        for t in _reads(op):
            last_read[t] = i
    for t in outputs:
        last_read[t] = n
    # a weight stored at a lower precision (scripts/litert/weight_storage.py): its DEQUANTIZE stays in its
    # reader's section, or the weight would cross the cut as a runtime tensor
    stored = {
        t
        for op in ops
        if _reads(op) and tensor_bytes[_reads(op)[0]] and tflite_file.op_name(model, op) == "DEQUANTIZE"
        for t in _writes(op)
    }
    # crossing[b]: the tensors computed before op b (graph inputs: "before op 0") and read from op b on
    # and unfit[b]: how many of them a cut at b cannot carry (not float32, or a stored weight), so it is not taken
    steps = {"all": [0] * (n + 2), "unfit": [0] * (n + 2)}

    def mark(key: str, lo: int, hi: int) -> None:
        lo, hi = max(lo, 1), min(hi, n - 1)
        if lo <= hi:
            steps[key][lo] += 1
            steps[key][hi + 1] -= 1

    for t, last in last_read.items():
        if tensor_bytes[t]:
            continue
        mark("all", produced.get(t, -1) + 1, last)
        if sg.tensors[t].type != schema.TensorType.FLOAT32 or t in stored:
            mark("unfit", produced.get(t, -1) + 1, last)
    crossing, unfit = (list(itertools.accumulate(steps[k][: n + 1])) for k in ("all", "unfit"))

    cuts, start = [0], 0
    while start < n:
        end, seen, size = start, set(), 0
        while end < n:
            new = {t for t in _reads(ops[end]) if tensor_bytes[t] and t not in seen}
            grown = size + sum(tensor_bytes[t] for t in new)
            if grown > max_bytes and end > start:
                break
            seen |= new
            size, end = grown, end + 1
        if end < n:  # the best boundary in (start, end]: fewest crossing tensors, the latest on a tie
            # (from half-way on: a cut early in the range would leave a section of a few ops)
            end = min(range(start + 1 + (end - start) // 2, end + 1), key=lambda b: (unfit[b] > 0, crossing[b], -b))
            while end < n and unfit[end]:  # no boundary fit for a cut within the limit: the next one
                end += 1
        cuts.append(end)
        start = end
    return sections_at(model, sg_index, outputs, cuts)


def sections_at(model, sg_index: int, outputs: list[int], cuts: list[int]) -> list[Section]:
    """The sections of subgraph `sg_index` between consecutive `cuts` (op indices, from 0 to the last op
    run), each with the tensors that cross its edges; `outputs` leave the last one. A cut that would
    carry a tensor that is not float32 is a ClefError naming it (the runner feeds and reads float32)."""
    sg = model.subgraphs[sg_index]
    tensor_bytes = _held_bytes(model, sg)
    ops = sg.operators[: cuts[-1]]
    last_read = {t: i for i, op in enumerate(ops) for t in _reads(op)}
    last_read.update({t: len(ops) for t in outputs})
    sections = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        inside = {t for op in ops[a:b] for t in _writes(op)}
        reads = [t for op in ops[a:b] for t in _reads(op)]
        ins = list(dict.fromkeys(t for t in reads if not tensor_bytes[t] and t not in inside))
        outs = sorted(t for t in inside if last_read.get(t, -1) >= b)
        crossing = (ins if a else []) + (outs if b < cuts[-1] else [])
        unfit = [t for t in crossing if sg.tensors[t].type != schema.TensorType.FLOAT32]
        if unfit:
            raise ClefError(
                f"a cut at op {a} or {b} carries {tflite_file.text(sg.tensors[unfit[0]].name)}, not float32"
            )
        size = sum(tensor_bytes[t] for t in {t for t in reads if tensor_bytes[t]})
        sections.append(Section(range(a, b), ins, outs, size))
    return sections


def plan(head: bytes, max_bytes: int, layers: int | None = None, hidden_size: int | None = None) -> list[SignaturePlan]:
    """One SignaturePlan per signature of the model whose flatbuffer head is `head`. layers: only the
    first `layers` decoder layers of a graph that has more (scripts/litert/layer_cut.py); the plan's
    outputs are then `hidden`, the residual stream after them, and the outputs computed before the cut."""
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(head))
    plans = []
    for sig in model.signatureDefs or []:
        ins = {tflite_file.text(e.name): int(e.tensorIndex) for e in sig.inputs}
        outs = {tflite_file.text(e.name): int(e.tensorIndex) for e in sig.outputs}
        p = SignaturePlan(tflite_file.text(sig.signatureKey), int(sig.subgraphIndex), ins, outs)
        c = layer_cut.cut(model, p.subgraph, layers, hidden_size) if layers else None
        if c is not None:
            produced = {int(t): i for i, op in enumerate(model.subgraphs[p.subgraph].operators) for t in _writes(op)}
            p.outputs = {"hidden": c.residual} | {
                k: t for k, t in outs.items() if k != "hidden" and produced.get(t, c.stop) < c.stop
            }
            p.cut = c
            ops = model.subgraphs[p.subgraph].operators
            reached = {tflite_file.op_name(model, op) for op in ops[: c.stop]}
            p.unreached = sorted({tflite_file.op_name(model, op) for op in ops[c.stop :]} - reached)
        p.sections = plan_subgraph(model, p.subgraph, list(p.outputs.values()), max_bytes, c and c.stop)
        plans.append(p)
    return plans


def write(source: Path, model, mm, sg_index: int, section: Section, dst: Path) -> None:
    """Section `section` of subgraph `sg_index` of `model` (the graph's object-API head; `mm` its file,
    mapped) as a model file `dst`: one signature, `serving_default`, from the crossing tensors to
    the crossing tensors, its constants stored after the flatbuffer (as the converter stores weights)."""
    sg = model.subgraphs[sg_index]
    const = _constants(model)
    ops = [sg.operators[i] for i in section.ops]
    used = list(dict.fromkeys(t for op in ops for t in [*_reads(op), *_writes(op)]))
    index = {t: i for i, t in enumerate(used)}
    out = schema.ModelT()
    out.version, out.description = model.version, f"section {section.ops.start}:{section.ops.stop} of {source.name}"
    out.operatorCodes = list(model.operatorCodes)
    out.buffers = [schema.BufferT()]
    data = []  # (buffer in `out`, bytes of the source buffer)
    copied = {}  # source buffer -> its one buffer in `out` (a stored weight read by several DEQUANTIZEs)
    tensors = []
    for t in used:
        tensor = copy.copy(sg.tensors[t])
        if tensor.buffer in const and tensor.buffer not in copied:
            b = schema.BufferT()
            b.offset, b.size = PLACEHOLDER_OFFSET, const[tensor.buffer]
            out.buffers.append(b)
            data.append((b, model.buffers[tensor.buffer]))
            copied[tensor.buffer] = len(out.buffers) - 1
        tensor.buffer = copied.get(tensor.buffer, 0)
        tensors.append(tensor)
    sub = schema.SubGraphT()
    sub.tensors, sub.name = tensors, sg.name
    sub.operators = []
    for op in ops:
        o = copy.copy(op)
        o.inputs = [index[int(t)] if t >= 0 else -1 for t in op.inputs]
        o.outputs = [index[int(t)] for t in op.outputs]
        sub.operators.append(o)
    produced = {t for op in ops for t in _writes(op)}
    exits = {t: index[t] for t in section.outputs}
    for t in section.outputs:
        if t in produced and sum(t in _reads(op) for op in ops) == 1:
            exits[t] = _copy(out, sub, index[t])
    sub.inputs = [index[t] for t in section.inputs]
    sub.outputs = list(exits.values())
    out.subgraphs = [sub]
    sig = schema.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = "serving_default", 0

    def entries(ts, at):
        maps = []
        for t in ts:
            m = schema.TensorMapT()
            m.name, m.tensorIndex = tensor_name(t), at[t]
            maps.append(m)
        return maps

    sig.inputs, sig.outputs = entries(section.inputs, index), entries(section.outputs, exits)
    out.signatureDefs = [sig]
    head_len = len(flatbuffer_utils.convert_object_to_bytearray(out))
    offset = -(-head_len // tflite_file.DATA_ALIGN) * tflite_file.DATA_ALIGN
    for b, _ in data:
        b.offset = offset
        offset = -(-(offset + b.size) // tflite_file.DATA_ALIGN) * tflite_file.DATA_ALIGN
    head = bytes(flatbuffer_utils.convert_object_to_bytearray(out))
    assert len(head) == head_len
    with open(dst, "wb") as f:
        f.write(head)
        for b, src in data:
            f.write(bytes(b.offset - f.tell()))
            if src.data is not None:
                f.write(np.asarray(src.data, dtype=np.uint8).tobytes())
            else:
                f.write(mm[src.offset : src.offset + src.size])


def _copy(model, sub, tensor: int) -> int:
    """Appends `copy = MUL(tensor, 1.0)` to subgraph `sub` of `model` (exact: NaN, inf and -0 kept) ->
    the copy's tensor index. The copy is a second reader, so the accelerator writes `tensor`, and the
    copy, read by nothing, is written as an output. (MAXIMUM(t, t) would need no constant, but the
    accelerator refuses an op that reads one tensor twice.)"""
    code = next((i for i, c in enumerate(model.operatorCodes) if c.builtinCode == schema.BuiltinOperator.MUL), None)
    if code is None:
        c = schema.OperatorCodeT()
        c.builtinCode = c.deprecatedBuiltinCode = schema.BuiltinOperator.MUL
        c.version = 1
        model.operatorCodes.append(c)
        code = len(model.operatorCodes) - 1
    one = schema.BufferT()
    one.data = np.frombuffer(np.float32(1.0).tobytes(), np.uint8).copy()
    model.buffers.append(one)
    constant = schema.TensorT()
    constant.shape, constant.type, constant.buffer = (
        np.array([], np.int32),
        schema.TensorType.FLOAT32,
        len(model.buffers) - 1,
    )
    constant.name = "one"
    t = copy.copy(sub.tensors[tensor])
    t.name = f"{tflite_file.text(t.name)};copy"
    sub.tensors += [constant, t]
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = code, [tensor, len(sub.tensors) - 2], [len(sub.tensors) - 1]
    op.builtinOptionsType = schema.BuiltinOptions.MulOptions
    op.builtinOptions = schema.MulOptionsT()
    sub.operators.append(op)
    return len(sub.tensors) - 1


class SectionedGraph:
    """Graph `path` cut into sections of at most `max_bytes` of constants each (in a temporary
    directory, removed by close()); one section, when the whole graph is within the limit, is the
    graph file itself. layers: only the first `layers` decoder layers (see `plan`). cuts: {signature:
    op indices} where those signatures are cut instead (sections_at; a trace of where a mode loses)."""

    def __init__(
        self,
        path,
        max_bytes: int,
        layers: int | None = None,
        hidden_size: int | None = None,
        cuts: dict[str, list[int]] | None = None,
    ):
        self.path, self.max_bytes = Path(path), max_bytes
        self._dir = tempfile.TemporaryDirectory(prefix="clef-sections-")
        head = tflite_file.read_head(self.path)
        self.plans = {p.name: p for p in plan(head, max_bytes, layers, hidden_size)}
        model = flatbuffer_utils.convert_bytearray_to_object(bytearray(head))
        for name, at in (cuts or {}).items():
            p = self.plans[name]
            p.sections = sections_at(model, p.subgraph, list(p.outputs.values()), at)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for p in self.plans.values():
                if len(p.sections) == 1 and p.cut is None:
                    p.sections[0].path = self.path
                    continue
                for k, s in enumerate(p.sections):
                    s.path = Path(self._dir.name) / f"{p.name}_{k}.tflite"
                    write(self.path, model, mm, p.subgraph, s, s.path)

    def close(self) -> None:
        self._dir.cleanup()

    def sections(self, signature: str) -> list[Section]:
        return self.plans[signature].sections

    def run(self, compile_section, signature: str, feeds: list[dict], progress: str | None = None) -> list[dict]:
        """Each of `feeds` ({signature input name: array}) through `signature`'s sections in order ->
        [{signature output name: array}]. compile_section(path) -> an object with .signature() (a
        callable on named arrays or tensors) and .close(); each section is compiled once for the
        whole batch and closed before the next. `progress`: a progress bar so named, one step a section
        (a section takes minutes on a software GPU at real width)."""
        from tqdm import tqdm

        p = self.plans[signature]
        whole = len(p.sections) == 1 and p.sections[0].path == self.path
        values = [{p.inputs[k]: v for k, v in feed.items()} for feed in feeds]
        needed = {t for s in p.sections for t in s.inputs if t in p.inputs.values()}
        for v in values:
            missing = sorted(k for k, t in p.inputs.items() if t in needed and t not in v)
            if missing:
                raise ClefError(f"{self.path.name} {signature}: no input {missing[0]} fed ({len(missing)} missing)")
        bar = tqdm(p.sections, desc=progress, unit="section", disable=progress is None, mininterval=2, leave=False)
        for index, s in enumerate(bar):
            compiled = compile_section(s.path)
            try:
                run = compiled.signature(signature if whole else None)
                for v in values:
                    if whole:
                        out = run(**{key: v[t] for key, t in p.inputs.items()})
                        v.update({p.outputs[key]: x for key, x in out.items()})
                    else:
                        out = run(**{tensor_name(t): v[t] for t in s.inputs})
                        v.update({int(key[1:]): x for key, x in out.items()})
            finally:
                compiled.close()
            later = {t for s2 in p.sections[index + 1 :] for t in s2.inputs} | set(p.outputs.values())
            for v in values:
                for t in [t for t in v if t not in later]:
                    del v[t]
        return [{key: v[t] for key, t in p.outputs.items()} for v in values]
