"""A converted graph's Linear weights re-encoded at the precision they were quantized to in torch.

scripts/layers/weight_precision.py replaces each Linear weight with the values its stored form
stands for before the conversion, so the converter writes those values as float32. `store` finds
each FULLY_CONNECTED's constant weight and, where every element round-trips exactly, stores it as
float16 or as int8 or int4 codes with one scale per output row, read by a DEQUANTIZE op placed just
before each op that uses the weight (the `weight_only` scheme, the pipeline's; one DEQUANTIZE per
reader, all of one stored buffer: a graph cut into sections keeps each weight beside its reader, and
any cut between two readers stays open). It is the form TensorFlow Lite's own float16 and weight-only
quantization writes; the CPU accelerator folds it into the weights when it loads the graph, the GPU
accelerator only a float16 one. A weight that does not round-trip is kept as float32 and counted,
never rounded here: this step changes no value.

`dynamic` (int8 and int4; the weights bench's) instead gives the FULLY_CONNECTED the integer
weight itself, as ai-edge-quantizer's dynamic recipes write it: int8 or packed int4 (two codes a byte,
the even element in the low nibble) with one scale per output row on the tensor, or int4 with a
float16 scale per block of a row (TensorFlow Lite's BlockwiseQuantization: a scales tensor
[out, in / block], no zero points). The CPU runs XNNPACK's dynamic kernels, which quantize the
activations to int8 while they run, so its outputs are no longer the torch model's to float32
rounding. The GPU accelerator reads the per-row forms in the shader with float activations, but only
from a rank-2 input: a FULLY_CONNECTED that flattens a higher-rank input itself (keep_num_dims false)
compiles and answers wrong, or fails to build a kernel (`flattened_inputs`). So each such reader is
given its input through a RESHAPE to [rows, in] first, which changes no value. Blockwise int4 aborts
the GPU accelerator's process (gpu_accelerator.compile refuses it before the accelerator sees it).
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
from scripts.pipeline.params import parse_weights
from scripts.pipeline.records import Record, optional

# Which precisions each scheme stores: a DEQUANTIZE before the reader, or the reader reading the weight itself.
SCHEMES = {"weight_only": ("fp32", "fp16", "int8", "int4"), "dynamic": ("int8", "int4")}
# The tensor type each precision stores a Linear weight as (tflite_file.census: fully_connected_weights).
STORED_TYPE = {"fp32": "FLOAT32", "fp16": "FLOAT16", "int8": "INT8", "int4": "INT4"}


def stored_type(weights: str) -> str:
    """The census's name for how `weights` (a params spelling) stores a Linear weight: int4b32 -> INT4/block32."""
    spec = parse_weights(weights)
    return STORED_TYPE[spec.precision] + (f"/block{spec.block}" if spec.block else "")


def blockwise(census: dict) -> list[str]:
    """The census's blockwise FULLY_CONNECTED weight types (LiteRT's GPU accelerator aborts the process on them)."""
    return sorted(t for t, n in census["fully_connected_weights"].items() if n and "/block" in t)


_SCALE_STEPS = 4  # neighbouring float32 scales tried when max|row| / 127 does not reproduce a row


@dataclasses.dataclass(frozen=True)
class Stored(Record):
    """What `store` did to one file (a graph's `weight_storage` metadata entry)."""

    precision: str  # params.yaml `weights` as given (int4b32: int4, blocks of 32)
    scheme: str
    weights: int  # distinct FULLY_CONNECTED weight buffers re-encoded
    kept_float32: int  # FULLY_CONNECTED weight buffers left float32 (a value that does not round-trip)
    float32_bytes: int  # the re-encoded weights' bytes as float32
    stored_bytes: int  # ... and as stored (int8/int4: codes and scales)
    bytes: int  # the file written
    block: int | None = optional()  # int4's block along the input; None: one scale per output row
    selections: int | None = optional()  # 0/1 constants left float32 by the dynamic scheme (is_selection)


def mismatch(census: dict, declared: str) -> list[str]:
    """A graph whose metadata says its weights are `declared` against the types its FULLY_CONNECTED
    weights are stored as (a constant that is not a Linear's may stay FLOAT32): one line per problem."""
    held = {t for t, n in census["fully_connected_weights"].items() if n}
    try:
        want = stored_type(declared)
    except ClefError:
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


def is_selection(w: np.ndarray) -> bool:
    """Whether a FULLY_CONNECTED constant holds only 0 and 1: a selection the kernel form builds (dd's segment
    sums), not a Linear weight. The dynamic scheme leaves it float32: the CPU's dynamic kernels would
    quantize the activations it selects (the decays) to int8."""
    return bool(np.all((w == 0) | (w == 1)))


def encode_fp16(w: np.ndarray) -> np.ndarray | None:
    """float32 values -> float16 holding exactly the same values, or None."""
    h = w.astype(np.float16)
    return h if np.array_equal(h.astype(np.float32), w) else None


def encode_rows(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray] | None:
    """float32 [out, in] values -> (codes in int8, float32 scales [out]) with codes x scales == w exactly
    row by row, or None. The scale is max|row| / levels as weight_precision computes it, or, where
    float32 rounding moved it, one of its nearest neighbours."""
    absmax = np.abs(w).max(axis=1)
    scales = np.where(absmax > 0, absmax / np.float32(levels), np.float32(1)).astype(np.float32)
    codes = np.zeros(w.shape, np.int8)
    pending = np.arange(w.shape[0])
    trial = scales.copy()
    for step in range(2 * _SCALE_STEPS + 1):
        q = np.clip(np.rint(w[pending] / trial[pending, None]), -levels, levels)
        exact = np.all(q.astype(np.float32) * trial[pending, None] == w[pending], axis=1)
        codes[pending[exact]] = q[exact].astype(np.int8)
        scales[pending[exact]] = trial[pending[exact]]
        pending = pending[~exact]
        if not len(pending):
            return codes, scales
        k = (step // 2 + 1) * (1 if step % 2 == 0 else -1)  # +1, -1, +2, -2, ...
        trial[pending] = _ulps(scales[pending], k)
    return None


def encode_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray] | None:
    """float32 [out, in] values -> (int4 codes in int8, float16 scales [out, in / block]) with codes x scales
    == w exactly, or None: weight_precision's formula (float16 scales hold their product exactly)."""
    import torch

    from scripts.layers.weight_precision import block_codes, block_scales

    if w.shape[1] % block:
        return None
    t = torch.from_numpy(w)
    scales = block_scales(t, block)
    codes = block_codes(t, scales)
    back = (codes.to(torch.float32).reshape(w.shape[0], -1, block) * scales[..., None]).reshape(w.shape)
    if not torch.equal(back, t):
        return None
    return codes.numpy(), scales.numpy().astype(np.float16)


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """int4 codes (int8 in [-8, 7]) -> bytes, two a byte, the even element in the low nibble (TensorFlow
    Lite's INT4 layout; an odd count pads the last high nibble with 0)."""
    flat = codes.reshape(-1).astype(np.uint8) & 0xF
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


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
    """A tensor for weight `t` as stored: its shape, the stored type, the stored buffer, int8's and int4's
    per-row scales."""
    stored = schema.TensorT()
    stored.name = tflite_file.text(t.name) + f";stored_{precision}"
    stored.shape, stored.type, stored.buffer = t.shape, dtype, buffer
    if scales is not None:
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint, q.quantizedDimension = scales.tolist(), [0] * len(scales), 0
        stored.quantization = q
    return stored


def _blockwise(sg, stored, scales_buffer: int, scales_shape: list[int], block: int) -> None:
    """Give `stored` (an int4 weight of subgraph `sg`) TensorFlow Lite's BlockwiseQuantization: a float16
    scales tensor [out, in / block] of this subgraph over `scales_buffer`, no zero points."""
    scales = schema.TensorT()
    scales.name = tflite_file.text(stored.name) + ";block_scales"
    scales.shape, scales.type, scales.buffer = scales_shape, schema.TensorType.FLOAT16, scales_buffer
    sg.tensors.append(scales)
    details = schema.BlockwiseQuantizationT()
    details.scales, details.zeroPoints, details.blockSize = len(sg.tensors) - 1, -1, block
    q = schema.QuantizationParametersT()
    q.detailsType, q.details, q.quantizedDimension = schema.QuantizationDetails.BlockwiseQuantization, details, 0
    stored.quantization = q


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


def _encode(w: np.ndarray, shape: list[int], spec) -> tuple[bytes, int, np.ndarray | None, np.ndarray | None] | None:
    """One weight's float32 values -> (stored bytes, tensor type, per-row scales, block scales), or None
    where a value does not round-trip."""
    from scripts.layers.weight_precision import LEVELS

    if spec.precision == "fp16":
        values = encode_fp16(w)
        return None if values is None else (values.tobytes(), schema.TensorType.FLOAT16, None, None)
    if len(shape) != 2:
        return None
    w = w.reshape(shape)
    if spec.block:
        pair = encode_blocks(w, spec.block)
        return None if pair is None else (pack_int4(pair[0]).tobytes(), schema.TensorType.INT4, None, pair[1])
    pair = encode_rows(w, LEVELS[spec.precision])
    if pair is None:
        return None
    codes, scales = pair
    if spec.precision == "int4":
        return pack_int4(codes).tobytes(), schema.TensorType.INT4, scales, None
    return codes.tobytes(), schema.TensorType.INT8, scales, None


def _carry_buffers(model, mm, sources: dict, metadata_buffers: set[int]) -> None:
    """Every buffer of `model` that a tensor still reads, read from the open map `mm` of its source file
    into `sources` (metadata kept inside the head); a buffer no tensor reads any more is emptied."""
    still_read = {t.buffer for sg in model.subgraphs for t in sg.tensors}
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


def pipeline_scheme(precision: str) -> str:
    """The scheme the pipeline stores `precision` by: integer weights read by the FULLY_CONNECTED itself
    (the form LiteRT's GPU accelerator keeps packed), float16 through a DEQUANTIZE (the one it folds)."""
    return "dynamic" if precision in SCHEMES["dynamic"] else "weight_only"


def store(src, dst, weights: str, scheme: str | None = None) -> Stored:
    """The graph `src` with its Linear weights stored at `weights` (a params.yaml spelling), by `scheme`
    (None: the pipeline's, pipeline_scheme), written atomically to `dst`."""
    spec = parse_weights(weights)
    scheme = scheme or pipeline_scheme(spec.precision)
    if spec.precision not in SCHEMES.get(scheme, ()):
        raise ClefError(f"weight storage scheme {scheme!r} does not apply to {spec.precision}")
    if spec.block and scheme != "dynamic":
        raise ClefError(f"weights {spec}: blockwise weights are read by the FULLY_CONNECTED itself (scheme dynamic)")
    src = Path(src)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(src)))
    metadata_buffers = {entry.buffer for entry in model.metadata or []}
    weights_found = {} if spec.precision == "fp32" else _weight_tensors(model)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        encoded: dict[int, tuple] = {}  # buffer -> (new buffer, type, row scales or None, block scales buffer)
        sources: dict[int, model_writer.Source] = {}
        kept = float_bytes = stored_bytes = selections = 0
        for b in weights_found:
            w = _read(mm, model.buffers[b])
            shape = [int(d) for d in model.subgraphs[weights_found[b][0][0]].tensors[weights_found[b][0][1]].shape]
            if scheme == "dynamic" and is_selection(w):
                selections += 1
                continue
            found = _encode(w, shape, spec)
            if found is None:
                kept += 1
                continue
            data, dtype, scales, block_scales = found
            index = model_writer.external(model, len(data))
            sources[index] = data
            scales_buffer = None
            if block_scales is not None:
                scales_buffer = model_writer.external(model, block_scales.nbytes)
                sources[scales_buffer] = block_scales.tobytes()
            encoded[b] = (index, dtype, scales, (scales_buffer, list(block_scales.shape)) if scales_buffer else None)
            float_bytes += w.nbytes
            stored_bytes += len(data) + sum(x.nbytes for x in (scales, block_scales) if x is not None)
        dequantize = _opcode(model, schema.BuiltinOperator.DEQUANTIZE) if encoded and scheme == "weight_only" else None
        added: dict[int, list] = {}  # subgraph -> (tensor, DEQUANTIZE op)
        for b, users in weights_found.items():
            if b not in encoded:
                continue
            index, dtype, scales, blocks = encoded[b]
            for si, ti in users:
                sg = model.subgraphs[si]
                t = sg.tensors[ti]
                if scheme == "dynamic":
                    # the FULLY_CONNECTED reads the integer weight itself, from a rank-2 input
                    sg.tensors[ti] = _stored_tensor(t, str(spec), dtype, index, scales)
                    if blocks is not None:
                        _blockwise(sg, sg.tensors[ti], blocks[0], blocks[1], spec.block)
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
                    sg.tensors.append(_stored_tensor(t, str(spec), dtype, index, scales))
                    op = schema.OperatorT()
                    op.opcodeIndex, op.inputs, op.outputs = dequantize, [len(sg.tensors) - 1], [out]
                    added.setdefault(si, []).append((out, op))
                t.buffer = 0  # now computed: the first reader's DEQUANTIZE's output
        for si, ops in added.items():
            _place_before_first_use(model.subgraphs[si], ops)
        _carry_buffers(model, mm, sources, metadata_buffers)
        written = model_writer.write(model, sources, dst)
    return Stored(
        str(spec),
        scheme,
        len(encoded),
        kept,
        float_bytes,
        stored_bytes,
        written,
        spec.block,
        selections if scheme == "dynamic" else None,
    )


def read_integer_weights(model) -> dict[int, list[int]]:
    """{subgraph: [tensor]} of every constant integer weight a FULLY_CONNECTED reads itself (the dynamic scheme)."""
    found: dict[int, list[int]] = {}
    for si, sg in enumerate(model.subgraphs):
        for op in sg.operators:
            if tflite_file.op_name(model, op) != "FULLY_CONNECTED" or len(op.inputs) < 2:
                continue
            ti, t = int(op.inputs[1]), sg.tensors[int(op.inputs[1])]
            held = t.type in (schema.TensorType.INT8, schema.TensorType.INT4)
            if held and tflite_file.buffer_bytes(model.buffers[t.buffer]) and ti not in found.get(si, []):
                found.setdefault(si, []).append(ti)
    return found


def dequantized(src, dst) -> int:
    """The graph `src` with every integer weight its FULLY_CONNECTEDs read themselves read through a
    DEQUANTIZE instead (one per reader, the weight_only form), written atomically to `dst` -> the number
    of weights so rewritten (0: nothing is written, the graph has none). The same codes and scales: the
    CPU folds them into float32 weights, so it computes what the GPU accelerator's fp32 mode and torch
    compute, where its dynamic kernels would round the activations to int8 (the conversion checks run
    this form: scripts/litert/cpu_graph.py).
    Blockwise weights are refused: TensorFlow Lite's DEQUANTIZE has no blockwise form."""
    src = Path(src)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(src)))
    metadata_buffers = {entry.buffer for entry in model.metadata or []}
    found = read_integer_weights(model)
    if not found:
        return 0
    dequantize = _opcode(model, schema.BuiltinOperator.DEQUANTIZE)
    for si, tensors in found.items():
        sg, ops = model.subgraphs[si], []
        for ti in tensors:
            t = sg.tensors[ti]
            if t.quantization is not None and t.quantization.detailsType:
                raise ClefError(f"{src}: {tflite_file.text(t.name)} is blockwise: no DEQUANTIZE reads it")
            for reader in [op for op in sg.operators if ti in _inputs(op)]:
                read = copy.copy(t)
                read.name, read.type, read.buffer, read.quantization = (
                    tflite_file.text(t.name) + ";dequantized",
                    schema.TensorType.FLOAT32,
                    0,
                    None,
                )
                sg.tensors.append(read)
                out = len(sg.tensors) - 1
                reader.inputs = [out if i == ti else i for i in _inputs(reader)]
                op = schema.OperatorT()
                op.opcodeIndex, op.inputs, op.outputs = dequantize, [ti], [out]
                ops.append((out, op))
        _place_before_first_use(sg, ops)
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        sources: dict[int, model_writer.Source] = {}
        _carry_buffers(model, mm, sources, metadata_buffers)
        model_writer.write(model, sources, dst)
    return sum(len(t) for t in found.values())
