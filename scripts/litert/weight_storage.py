"""A converted graph's Linear weights re-encoded at the precision they were quantized to in torch.

scripts/layers/weight_precision.py replaces each Linear weight with the values its stored form
stands for before the conversion, so the converter writes those values as float32. `store` finds
each FULLY_CONNECTED's constant weight and, where every element round-trips exactly, stores it as
float16 or as int8 codes with one scale per output row, read by a DEQUANTIZE op placed just before
each op that uses the weight (one per reader, all of one stored buffer: a graph cut into sections
keeps each weight beside its reader, and any cut between two readers stays open). It
is the form TensorFlow Lite's own float16 and weight-only quantization writes; the CPU and GPU
accelerators fold it into the weights when they load the graph. A weight that does not round-trip
is kept as float32 and counted, never rounded here: this step changes no value.

`dynamic` (int8 only) instead gives the FULLY_CONNECTED the int8 weight itself, per-channel scales
on the tensor: the hybrid kernel, which quantizes the activations too while it runs (XNNPACK's
int8 path), so its outputs are no longer the torch model's to float32 rounding. The GPU accelerator
reads such a weight too, dequantized in the shader, but only from a rank-2 input: a FULLY_CONNECTED
that flattens a higher-rank input itself (keep_num_dims false) compiles and answers wrong, or fails to
build a kernel (`flattened_inputs`). So each such reader is given its input through a RESHAPE to
[rows, in] first, which changes no value.
"""

from __future__ import annotations

import copy
import dataclasses
import mmap
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from scripts.litert import model_writer, tflite_file
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record

INT8_SCHEMES = ("weight_only", "dynamic")
# The tensor type each precision stores a Linear weight as (tflite_file.census: fully_connected_weights).
STORED_TYPE = {"fp32": "FLOAT32", "fp16": "FLOAT16", "int8": "INT8"}
_SCALE_STEPS = 4  # neighbouring float32 scales tried when max|row| / 127 does not reproduce a row


@dataclasses.dataclass(frozen=True)
class Stored(Record):
    """What `store` did to one file (a graph's `weight_storage` metadata entry)."""

    precision: str
    scheme: str
    weights: int  # distinct FULLY_CONNECTED weight buffers re-encoded
    kept_float32: int  # FULLY_CONNECTED weight buffers left float32 (a value that does not round-trip)
    float32_bytes: int  # the re-encoded weights' bytes as float32
    stored_bytes: int  # ... and as stored (int8: codes and scales)
    bytes: int  # the file written


def mismatch(census: dict, declared: str) -> list[str]:
    """A graph whose metadata says its weights are `declared` against the types its FULLY_CONNECTED
    weights are stored as (a constant that is not a Linear's may stay FLOAT32): one line per problem."""
    held = {t for t, n in census["fully_connected_weights"].items() if n}
    want = STORED_TYPE.get(declared)
    if want is None:
        return [f"metadata says weights {declared!r}, not one of {', '.join(STORED_TYPE)}"]
    others = sorted(held - {want, "FLOAT32"})
    out = (
        [f"metadata says weights {declared}, but FULLY_CONNECTED weights are stored as {', '.join(others)}"]
        if others
        else []
    )
    if want != "FLOAT32" and want not in held:
        out.append(f"metadata says weights {declared}, but no FULLY_CONNECTED weight is stored as {want}")
    return out


def encode_fp16(w: np.ndarray) -> np.ndarray | None:
    """float32 values -> float16 holding exactly the same values, or None."""
    h = w.astype(np.float16)
    return h if np.array_equal(h.astype(np.float32), w) else None


def encode_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """float32 [out, in] values -> (int8 codes, float32 scales [out]) with codes x scales == w exactly
    row by row, or None. The scale is max|row| / 127 as weight_precision computes it, or, where
    float32 rounding moved it, one of its nearest neighbours."""
    from scripts.layers.weight_precision import INT8_LEVELS

    absmax = np.abs(w).max(axis=1)
    scales = np.where(absmax > 0, absmax / np.float32(INT8_LEVELS), np.float32(1)).astype(np.float32)
    codes = np.zeros(w.shape, np.int8)
    pending = np.arange(w.shape[0])
    trial = scales.copy()
    for step in range(2 * _SCALE_STEPS + 1):
        q = np.clip(np.rint(w[pending] / trial[pending, None]), -INT8_LEVELS, INT8_LEVELS)
        exact = np.all(q.astype(np.float32) * trial[pending, None] == w[pending], axis=1)
        codes[pending[exact]] = q[exact].astype(np.int8)
        scales[pending[exact]] = trial[pending[exact]]
        pending = pending[~exact]
        if not len(pending):
            return codes, scales
        k = (step // 2 + 1) * (1 if step % 2 == 0 else -1)  # +1, -1, +2, -2, ...
        trial[pending] = _ulps(scales[pending], k)
    return None


def _ulps(x: np.ndarray, k: int) -> np.ndarray:
    """x moved by k float32 ulps (x > 0)."""
    return (x.view(np.int32) + np.int32(k)).view(np.float32)


def _weight_tensors(model) -> dict[int, list[tuple[int, int]]]:
    """{buffer: [(subgraph, tensor)]} of every FULLY_CONNECTED weight held as a float32 constant."""
    found: dict[int, list[tuple[int, int]]] = {}
    for si, sg in enumerate(model.subgraphs):
        for op in sg.operators:
            if tflite_file.op_name(model, op) != "FULLY_CONNECTED" or len(op.inputs) < 2:
                continue
            t = sg.tensors[op.inputs[1]]
            if t.type == schema.TensorType.FLOAT32 and tflite_file.buffer_bytes(model.buffers[t.buffer]):
                pair = (si, int(op.inputs[1]))
                if pair not in found.setdefault(t.buffer, []):
                    found[t.buffer].append(pair)
    return found


def _opcode(model, builtin: int) -> int:
    for i, code in enumerate(model.operatorCodes):
        if flatbuffer_utils.get_builtin_code_from_operator_code(code) == builtin:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _inputs(op) -> list[int]:
    return [int(i) for i in (op.inputs if op.inputs is not None else [])]


def _stored_tensor(t, precision: str, dtype: int, buffer: int, scales: np.ndarray | None):
    """A tensor for weight `t` as stored: its shape, the stored type, the stored buffer, int8's per-row scales."""
    stored = schema.TensorT()
    stored.name = tflite_file.text(t.name) + f";stored_{precision}"
    stored.shape, stored.type, stored.buffer = t.shape, dtype, buffer
    if scales is not None:
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint, q.quantizedDimension = scales.tolist(), [0] * len(scales), 0
        stored.quantization = q
    return stored


def _place_before_first_use(sg, ops: list) -> None:
    """Insert each (tensor, DEQUANTIZE) just before the first operator that reads the tensor."""
    by_tensor = dict(ops)
    placed, out = set(), []
    for op in sg.operators:
        for t in op.inputs if op.inputs is not None else []:
            if t in by_tensor and t not in placed:
                out.append(by_tensor[t])
                placed.add(t)
        out.append(op)
    sg.operators = out


def flattened_inputs(sg, op) -> bool:
    """Whether FULLY_CONNECTED `op` flattens its input itself: keep_num_dims false on an input of rank > 2
    (the GPU accelerator's integer-weight kernel mishandles it: the module doc)."""
    shape = sg.tensors[op.inputs[0]].shape
    keeps = bool(getattr(op.builtinOptions, "keepNumDims", False))
    return not keeps and shape is not None and len(shape) > 2


def _flatten_input(model, sg, op) -> None:
    """Give FULLY_CONNECTED `op` its input as [rows, in] through a RESHAPE placed just before it."""
    src = sg.tensors[op.inputs[0]]
    shape = [int(d) for d in src.shape]
    flat = [int(np.prod(shape[:-1])), shape[-1]]
    out = schema.TensorT()
    out.name, out.shape, out.type, out.buffer = tflite_file.text(src.name) + ";rows", flat, src.type, 0
    sg.tensors.append(out)
    new_shape = schema.TensorT()
    new_shape.name, new_shape.shape, new_shape.type = (
        tflite_file.text(src.name) + ";rows_shape",
        [2],
        schema.TensorType.INT32,
    )
    new_shape.buffer = model_writer.inline(model, np.array(flat, np.int32).tobytes())
    sg.tensors.append(new_shape)
    reshape = schema.OperatorT()
    reshape.opcodeIndex = _opcode(model, schema.BuiltinOperator.RESHAPE)
    reshape.inputs, reshape.outputs = [int(op.inputs[0]), len(sg.tensors) - 1], [len(sg.tensors) - 2]
    reshape.builtinOptionsType = schema.BuiltinOptions.ReshapeOptions
    reshape.builtinOptions = schema.ReshapeOptionsT()
    reshape.builtinOptions.newShape = flat
    op.inputs = [len(sg.tensors) - 2, *_inputs(op)[1:]]
    sg.operators.insert(sg.operators.index(op), reshape)


def _read(mm, buffer) -> np.ndarray:
    if buffer.offset > 1:
        return np.frombuffer(mm, np.float32, buffer.size // 4, buffer.offset).copy()
    return np.frombuffer(bytes(buffer.data), np.float32).copy()


def store(src, dst, precision: str, scheme: str = "weight_only") -> Stored:
    """The graph `src` with its Linear weights stored at `precision`, written atomically to `dst`."""
    from scripts.pipeline.params import WEIGHT_PRECISIONS

    if precision not in WEIGHT_PRECISIONS:
        raise ClefError(f"weights {precision!r} is not one of {', '.join(WEIGHT_PRECISIONS)}")
    if scheme not in INT8_SCHEMES or (scheme == "dynamic" and precision != "int8"):
        raise ClefError(f"weight storage scheme {scheme!r} does not apply to {precision}")
    src = Path(src)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(src)))
    metadata_buffers = {entry.buffer for entry in model.metadata or []}
    weights = {} if precision == "fp32" else _weight_tensors(model)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        encoded: dict[int, tuple] = {}  # buffer -> (new buffer, type, scales or None)
        sources: dict[int, model_writer.Source] = {}
        kept = float_bytes = stored_bytes = 0
        for b in weights:
            w = _read(mm, model.buffers[b])
            shape = [int(d) for d in model.subgraphs[weights[b][0][0]].tensors[weights[b][0][1]].shape]
            if precision == "fp16":
                values, scales, dtype = encode_fp16(w), None, schema.TensorType.FLOAT16
            else:
                pair = encode_int8(w.reshape(shape[0], -1)) if len(shape) == 2 else None
                values, scales = pair if pair is not None else (None, None)
                dtype = schema.TensorType.INT8
            if values is None:
                kept += 1
                continue
            data = values.tobytes()
            index = model_writer.external(model, len(data))
            sources[index] = data
            encoded[b] = (index, dtype, scales)
            float_bytes += w.nbytes
            stored_bytes += len(data) + (scales.nbytes if scales is not None else 0)
        dequantize = _opcode(model, schema.BuiltinOperator.DEQUANTIZE) if encoded and scheme == "weight_only" else None
        added: dict[int, list] = {}  # subgraph -> (tensor, DEQUANTIZE op)
        still_read = set()
        for b, users in weights.items():
            if b not in encoded:
                continue
            index, dtype, scales = encoded[b]
            for si, ti in users:
                sg = model.subgraphs[si]
                t = sg.tensors[ti]
                if scheme == "dynamic":
                    # the FULLY_CONNECTED reads the int8 weight itself, from a rank-2 input
                    sg.tensors[ti] = _stored_tensor(t, precision, dtype, index, scales)
                    for reader in [op for op in sg.operators if ti in _inputs(op)]:
                        if tflite_file.op_name(model, reader) == "FULLY_CONNECTED" and flattened_inputs(sg, reader):
                            _flatten_input(model, sg, reader)
                    continue
                # one DEQUANTIZE per reader, all of the one stored buffer: a weight read by several ops (equal
                # constants are one buffer) is expanded beside each, so a section cut can fall between them
                readers = [op for op in sg.operators if ti in _inputs(op)]
                for k, reader in enumerate(readers):
                    out = ti
                    if k:
                        expanded = copy.copy(t)
                        expanded.name, expanded.buffer = tflite_file.text(t.name) + f";reader_{k}", 0
                        sg.tensors.append(expanded)
                        out = len(sg.tensors) - 1
                        reader.inputs = [out if i == ti else i for i in _inputs(reader)]
                    sg.tensors.append(_stored_tensor(t, precision, dtype, index, scales))
                    op = schema.OperatorT()
                    op.opcodeIndex, op.inputs, op.outputs = dequantize, [len(sg.tensors) - 1], [out]
                    added.setdefault(si, []).append((out, op))
                t.buffer = 0  # now computed: the first reader's DEQUANTIZE's output
        for si, ops in added.items():
            _place_before_first_use(model.subgraphs[si], ops)
        for sg in model.subgraphs:
            still_read.update(t.buffer for t in sg.tensors)
        for i, buffer in enumerate(model.buffers):
            if i in metadata_buffers and buffer.offset > 1:  # small: kept inside the head
                buffer.data, buffer.offset, buffer.size = list(mm[buffer.offset : buffer.offset + buffer.size]), 0, 0
            if i in metadata_buffers or i in sources or not tflite_file.buffer_bytes(buffer):
                continue
            if i not in still_read:
                model.buffers[i] = schema.BufferT()  # a weight now stored in its smaller form
                continue
            if buffer.offset > 1:
                sources[i] = model_writer.Slice(mm, buffer.offset, buffer.size)
                buffer.offset = model_writer.OFFSET_PLACEHOLDER
            else:
                sources[i] = bytes(buffer.data)
                buffer.data, buffer.offset, buffer.size = None, model_writer.OFFSET_PLACEHOLDER, len(sources[i])
        written = model_writer.write(model, sources, dst)
    return Stored(precision, scheme, len(encoded), kept, float_bytes, stored_bytes, written)
