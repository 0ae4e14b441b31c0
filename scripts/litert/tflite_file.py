"""Reading a `.tflite` file itself: its op census, and the provenance metadata we embed in it.

The census is what GPU delegates and stock interpreters care about, read from the flatbuffer rather
than trusted from the converter: every op with its count, the largest tensor rank, the tensor dtypes,
and the ops of each GatedDeltaNet layer (attributed through the source-module paths the converter
writes into tensor names). `violations()` lists what makes a model unfit: a tensor of rank > 4, a
custom op, a STABLEHLO_* op, an op of BANNED_OPS (WHILE, CUMSUM, GATHER_ND, BROADCAST_TO), an int64
tensor, a PAD of a tensor of rank < 4, a signature output that is an input or another output's tensor,
a constant larger than a GPU binds as one buffer.

A flatbuffer cannot exceed 2 GB, so a larger model is written as a small flatbuffer head followed by
the weight data, each buffer naming its absolute file offset. Everything here reads only the head
(`read_head`), and `write_with_metadata` rebuilds the head and shifts the data after it (in place
where the filesystem can), with the offsets: a 3.5 GB graph is never held in memory, let alone
re-serialized.
"""

from __future__ import annotations

import collections
import hashlib
import json
import mmap
import re
import shutil
from pathlib import Path
from typing import Any

from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

METADATA_NAME = "clef_litert"
FILE_IDENTIFIER = b"TFL3"  # bytes 4-8 of every TFLite flatbuffer
# Ops a graph must not hold, with who refuses them: the census gate (`violations`) fails an export and
# a verify stage on any of them. BROADCAST_TO passes the interpreter and LiteRT's ModelAnalyzer in GPU
# mode, but the GPU accelerator refuses it (and with it the whole graph, GPU-only): learned by verify_gpu.
# Ops LiteRT's GPU accelerator runs right only on inputs of at least this rank, learned by verify_gpu:
# PAD of rank 2 is refused ("Invalid paddings tensor shape: expected 4x2 or 3x2, got 2x2"), and a
# rank-3 PAD it accepts computed wrong here (tests/test_gpu_accelerator.py shows both).
RANK_LIMITED_OPS = {"PAD": 4}
BANNED_OPS = {
    "WHILE": "loops: GPU delegates and NNAPI run no control flow",
    "CUMSUM": "GPU delegates have no cumulative sum",
    "GATHER_ND": "GPU delegates reject it",
    "BROADCAST_TO": "LiteRT's GPU accelerator: 'Operation is not supported'",
}
MAX_RANK = 4
# The largest constant tensor a GPU binds as one storage buffer: WebGPU's default
# maxStorageBufferBindingSize. LiteRT's GPU accelerator does not refuse a larger one: in fp32 mode it
# computes the FULLY_CONNECTED wrong, without a word (tests/test_gpu_accelerator.py). The export splits
# larger Linear weights by output rows (scripts/layers/split_linear.py).
MAX_CONSTANT_BYTES = 128 * 2**20
_OP_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
_TYPE_NAMES = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
_GDN_LAYER = re.compile(r"DecoderLayer_(\d+)/[^/;]*ClefGatedDeltaNet")


DATA_ALIGN = 64  # external buffers start on 64-byte boundaries (the converter's own choice: SIMD loads)
# The data region moves by a multiple of this when the head grows: a filesystem block (ext4's and
# XFS's usual size), so the move can be done in place (`shift_in_place`); a multiple of DATA_ALIGN too.
# The copy that stands in where it cannot moves by the same amount, so the bytes do not depend on it.
HEAD_ROOM = 4096
COPY_CHUNK = 1 << 26
FALLOC_FL_INSERT_RANGE = 0x20  # linux/falloc.h


def _data_start(buf) -> int:
    """Where the external weight data begins (the smallest buffer offset), or len(buf) if the model
    keeps all its data inside the flatbuffer. Offsets 0 and 1 mean "inline" in the schema."""
    model = schema.Model.GetRootAs(buf, 0)
    offsets = [model.Buffers(i).Offset() for i in range(model.BuffersLength())]
    external = [o for o in offsets if o > 1]
    return min(external) if external else len(buf)


def truncation(buf, size: int) -> str | None:
    """Why the flatbuffer at the start of `buf` (a file of `size` bytes) is cut short, or None: a table
    or vector that reaches past the end (found by unpacking the whole flatbuffer: flatbuffers reads
    lazily, so a file cut by a few bytes still yields its metadata), or an external buffer that does."""
    try:
        head = bytearray(buf[: _data_start(buf)])
        model = flatbuffer_utils.convert_bytearray_to_object(head)
    except Exception as exc:  # struct.error / ValueError / IndexError on a cut table or vector
        return f"its flatbuffer cannot be read to the end ({type(exc).__name__}: {exc})"
    for i, b in enumerate(model.buffers or []):
        if b.offset > 1 and b.offset + b.size > size:
            return f"buffer {i} ends at byte {b.offset + b.size}, past the file's {size} bytes"
    return None


def read_head(path) -> bytes:
    """The flatbuffer part of a .tflite file: the whole file when it is under the 2 GB limit, else
    the bytes before the first external buffer (read through mmap, never the weights). A file cut
    short is a ClefError, not a model with part of its weights."""
    from scripts.pipeline.errors import ClefError

    size = Path(path).stat().st_size
    if size < 8:
        raise ClefError(f"{path} is not a readable .tflite model: {size} bytes")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[4:8] != FILE_IDENTIFIER:
            raise ClefError(f"{path} is not a readable .tflite model: no {FILE_IDENTIFIER.decode()} identifier")
        why = truncation(mm, size)
        if why is None:
            return bytes(mm[: _data_start(mm)])
    raise ClefError(f"{path} is truncated or damaged: {why}")


def _head_of(model) -> bytes:
    """`model` is the bytes of a whole (small) model, or a path to a file of any size."""
    return model if isinstance(model, (bytes, bytearray)) else read_head(model)


def text(x) -> str:
    """A flatbuffer string field (bytes, str or None) as str."""
    return x.decode() if isinstance(x, bytes) else (x or "")


def buffer_bytes(buffer) -> int:
    """Bytes of data a buffer holds, stored inline or after the flatbuffer (0: no data)."""
    return len(buffer.data) if buffer.data is not None else (buffer.size if buffer.offset > 1 else 0)


def op_name(model, op) -> str:
    code = model.operatorCodes[op.opcodeIndex]
    builtin = flatbuffer_utils.get_builtin_code_from_operator_code(code)
    if builtin == schema.BuiltinOperator.CUSTOM:
        return f"CUSTOM:{text(code.customCode)}"
    return _OP_NAMES.get(builtin, f"UNKNOWN_{builtin}")


def census(source) -> dict:
    """`source`: model bytes or a .tflite path."""
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(_head_of(source)))
    ops = collections.Counter()
    dtypes = collections.Counter()
    max_rank = 0
    per_gdn = collections.Counter()
    low_rank = collections.Counter()
    weight_types = collections.Counter()
    for sg in model.subgraphs:
        weight_types.update(_fully_connected_weight_types(model, sg))
        for t in sg.tensors:
            dtypes[_TYPE_NAMES.get(t.type, str(t.type))] += 1
            max_rank = max(max_rank, len(t.shape) if t.shape is not None else 0)
        for op in sg.operators:
            name = op_name(model, op)
            ops[name] += 1
            if name in RANK_LIMITED_OPS and len(sg.tensors[op.inputs[0]].shape) < RANK_LIMITED_OPS[name]:
                low_rank[name] += 1
            first_path = text(sg.tensors[op.outputs[0]].name).split(";")[0] if len(op.outputs) else ""
            stored_weight = name == "DEQUANTIZE" and buffer_bytes(model.buffers[sg.tensors[op.inputs[0]].buffer])
            if not stored_weight and (m := _GDN_LAYER.search(first_path)):
                per_gdn[int(m.group(1))] += 1
    constant_bytes = [buffer_bytes(b) for b in model.buffers or []]
    signatures = {}
    for sig in model.signatureDefs or []:
        sg = model.subgraphs[sig.subgraphIndex]
        sig_ops = collections.Counter(op_name(model, op) for op in sg.operators)

        def io(entries, sg=sg):
            return [
                {
                    "name": text(e.name),
                    "shape": [int(d) for d in sg.tensors[e.tensorIndex].shape],
                    "dtype": _TYPE_NAMES.get(sg.tensors[e.tensorIndex].type, "?").lower(),
                }
                for e in entries
            ]

        inputs = {e.tensorIndex: text(e.name) for e in sig.inputs}
        by_tensor = collections.defaultdict(list)
        for e in sig.outputs:
            by_tensor[e.tensorIndex].append(text(e.name))
        aliased = sorted(
            [f"{', '.join(sorted(names))} = input {inputs[t]}" for t, names in by_tensor.items() if t in inputs]
            + [" = ".join(sorted(names)) for t, names in by_tensor.items() if len(names) > 1 and t not in inputs]
        )
        signatures[text(sig.signatureKey)] = {
            "inputs": io(sig.inputs),
            "outputs": io(sig.outputs),
            "ops": dict(sorted(sig_ops.items())),
            "aliased_outputs": aliased,
        }
    return {
        "ops": dict(sorted(ops.items())),
        "op_total": sum(ops.values()),
        "max_rank": max_rank,
        "max_constant_bytes": max(constant_bytes, default=0),
        "dtypes": dict(sorted(dtypes.items())),
        "subgraphs": len(model.subgraphs),
        "ops_per_gdn_layer": {str(k): v for k, v in sorted(per_gdn.items())},
        "low_rank_ops": dict(sorted(low_rank.items())),
        "fully_connected_weights": dict(sorted(weight_types.items())),
        "signatures": signatures,
    }


def _fully_connected_weight_types(model, sg) -> list[str]:
    """The type each FULLY_CONNECTED's constant weight is stored as, once per stored buffer: its own
    type, or the stored type a DEQUANTIZE reads it from (scripts/litert/weight_storage.py: one
    DEQUANTIZE per reader, all of the one buffer); stored_type_name."""
    dequantized = {}  # DEQUANTIZE output -> the stored tensor it reads
    for op in sg.operators:
        if op_name(model, op) == "DEQUANTIZE" and buffer_bytes(model.buffers[sg.tensors[op.inputs[0]].buffer]):
            dequantized[op.outputs[0]] = sg.tensors[op.inputs[0]]
    seen, out = set(), []
    for op in sg.operators:
        if op_name(model, op) != "FULLY_CONNECTED" or len(op.inputs) < 2:
            continue
        t = dequantized.get(op.inputs[1], sg.tensors[op.inputs[1]])
        if t.buffer in seen or not buffer_bytes(model.buffers[t.buffer]):
            continue
        out.append(stored_type_name(t))
        seen.add(t.buffer)
    return out


def stored_type_name(t) -> str:
    """A weight tensor's type as the census names it: the tensor type, and `/block32` where its scales come
    in blocks of 32 along the input (TensorFlow Lite's BlockwiseQuantization)."""
    name = _TYPE_NAMES.get(t.type, "?")
    q = t.quantization
    if q is not None and q.detailsType == schema.QuantizationDetails.BlockwiseQuantization:
        name += f"/block{q.details.blockSize}"
    return name


def violations(c: dict) -> list[str]:
    """What makes the model unfit for GPU delegates and stock interpreters, one line each."""
    out = []
    if c["max_rank"] > MAX_RANK:
        out.append(f"a tensor of rank {c['max_rank']} (> {MAX_RANK})")
    if c["max_constant_bytes"] > MAX_CONSTANT_BYTES:
        out.append(
            f"a constant of {c['max_constant_bytes']} bytes (> {MAX_CONSTANT_BYTES}, WebGPU's default storage "
            "buffer binding limit: LiteRT's GPU accelerator computes it wrong in fp32)"
        )
    for op, n in c["ops"].items():
        if op in BANNED_OPS:
            out.append(f"op {op} x{n} ({BANNED_OPS[op]})")
        elif op.startswith("CUSTOM:") or op.startswith("STABLEHLO_"):
            out.append(f"op {op} x{n}")
    for op, n in c.get("low_rank_ops", {}).items():
        out.append(
            f"op {op} x{n} on a tensor of rank < {RANK_LIMITED_OPS[op]} "
            "(LiteRT's GPU accelerator refuses it or computes it wrong)"
        )
    for name, sig in c["signatures"].items():
        for alias in sig.get("aliased_outputs", []):
            out.append(
                f"signature {name}: outputs that are one tensor ({alias}): CompiledModel names them after "
                "one tensor, and the GPU accelerator leaves an output that is an input unwritten"
            )
    if c["dtypes"].get("INT64"):
        out.append(f"{c['dtypes']['INT64']} int64 tensors")
    return out


def _with_entry(head: bytes, meta: dict, shift: int):
    """The object-API model of `head` with `meta` as its METADATA_NAME entry (an old one replaced)
    and every external buffer offset moved by `shift` bytes."""
    # convert_bytearray_to_object, not read_model_from_bytearray: the latter resolves external
    # buffers into inline data and zeroes their offsets, which would silently drop the weights.
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(head))
    for op in (o for sg in model.subgraphs for o in sg.operators):
        if getattr(op, "largeCustomOptionsOffset", 0) > 1:
            raise ValueError("a model with external custom options cannot be re-headed")
    model.metadata = [m for m in (model.metadata or []) if text(m.name) != METADATA_NAME]
    for buf in model.buffers:
        if buf.offset > 1:
            buf.offset += shift
    buf = schema.BufferT()
    buf.data = list(json.dumps(meta, sort_keys=True).encode())
    model.buffers.append(buf)
    entry = schema.MetadataT()
    entry.name = METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    model.metadata.append(entry)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def with_metadata(content: bytes, meta: dict) -> bytes:
    """A small (inline-data) model's bytes with `meta` stored as its METADATA_NAME entry."""
    if _data_start(content) != len(content):
        raise ValueError("model has external buffers: use write_with_metadata on its file")
    return _with_entry(content, meta, 0)


def shift_in_place(path: Path, shift: int, head: bytes) -> bool:
    """Move all of file `path` `shift` bytes up without copying it (Linux's fallocate with
    FALLOC_FL_INSERT_RANGE, which ext4 and XFS do for a block-aligned shift), then write `head` over
    its start and fsync it; -> False, the file untouched, where the filesystem cannot."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    with open(path, "r+b") as f:
        if libc.fallocate(f.fileno(), FALLOC_FL_INSERT_RANGE, 0, shift) != 0:
            return False
        f.write(head)
        f.flush()
        os.fsync(f.fileno())
    return True


def write_with_metadata(src, dst, meta: dict, consume: bool = False) -> int:
    """Write model file `src` to `dst` (atomically) with `meta` as its METADATA_NAME entry; -> bytes.

    A model with external buffers gets a new head, then the data region unchanged, shifted as a whole
    by a multiple of HEAD_ROOM, so every buffer keeps its alignment. `consume`: `src` is a scratch file
    on `dst`'s filesystem that this may use up, shifting its data in place (shift_in_place) and renaming
    it to `dst` instead of copying a multi-GB file; it is gone afterwards either way."""
    from scripts.pipeline import atomic

    src = Path(src)
    size = src.stat().st_size
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        start = _data_start(mm)
        head = bytes(mm[:start])
    if start == size:
        atomic.write_bytes(dst, _with_entry(head, meta, 0))
    else:
        # The new head's length does not depend on the shift (offsets are fixed-width fields), so one
        # trial build gives the length; the shift is then the smallest one that clears it.
        grown = len(_with_entry(head, meta, 0)) - start
        shift = -(-grown // HEAD_ROOM) * HEAD_ROOM
        new_head = _with_entry(head, meta, shift)
        assert len(new_head) <= start + shift
        new_head += bytes(start + shift - len(new_head))
        if consume and shift_in_place(src, shift, new_head):
            src.replace(dst)
            return Path(dst).stat().st_size
        with atomic.writing(dst) as out, open(src, "rb") as f:
            out.write(new_head)
            f.seek(start)
            shutil.copyfileobj(f, out, COPY_CHUNK)
    if consume:
        src.unlink()
    return Path(dst).stat().st_size


def read_metadata(source) -> dict[str, Any] | None:
    """The METADATA_NAME entry of model bytes or a .tflite path (only its head is read)."""
    buf = _head_of(source)
    model = schema.Model.GetRootAs(buf, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if text(entry.Name()) == METADATA_NAME:
            return json.loads(model.Buffers(entry.Buffer()).DataAsNumpy().tobytes().decode())
    return None


def content_digest(path) -> str:
    """sha256 of what a graph computes with, its METADATA_NAME entry left out: every op, tensor and
    buffer, external weights included (hashed in place through mmap). Two exports of the same graph at
    different commits differ only in that entry (it names the commit), so "byte-identical graphs"
    before and after a change that moves no op is this digest being equal."""
    from scripts.pipeline import profile

    with profile.part("hashing"):
        return _content_digest(path)


def _content_digest(path) -> str:
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(read_head(path)))
    ours = {m.buffer for m in model.metadata or [] if text(m.name) == METADATA_NAME}
    model.metadata = [m for m in model.metadata or [] if text(m.name) != METADATA_NAME]
    digest = hashlib.sha256()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for i, buf in enumerate(model.buffers or []):
            if i in ours:
                buf.data = None
            elif buf.offset > 1:  # external data: hashed in order, its offset (which the head's size moves) dropped
                with memoryview(mm) as view:
                    digest.update(view[buf.offset : buf.offset + buf.size])
                buf.offset, buf.size = 0, 0
    digest.update(bytes(flatbuffer_utils.convert_object_to_bytearray(model)))
    return digest.hexdigest()


def metadata_mismatches(meta: dict | None, expected: dict) -> list[str]:
    """What a graph's metadata (read_metadata) says against what it should: one phrase per key that
    differs, [] when every expected key agrees. Every check of a graph's identity goes through here."""
    if meta is None:
        return [f"no {METADATA_NAME} metadata entry"]
    return [f"{k} is {meta.get(k)!r}, expected {v!r}" for k, v in expected.items() if meta.get(k) != v]


def matmul_flops(source) -> dict[str, int]:
    """FLOPs of the model's multiply-accumulate ops, counted from its tensor shapes (2 per MAC):
    FULLY_CONNECTED, BATCH_MATMUL, DEPTHWISE_CONV_2D. What the row graph must compute at least; the
    elementwise ops are not counted. -> {op name: flops}."""
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(_head_of(source)))
    out = collections.Counter()
    for sg in model.subgraphs:
        shape = lambda i, sg=sg: [int(d) for d in sg.tensors[i].shape]  # noqa: E731
        for op in sg.operators:
            name = op_name(model, op)
            result = 1
            for d in shape(op.outputs[0]):
                result *= d
            if name == "FULLY_CONNECTED":  # weights [out, in]
                k = shape(op.inputs[1])[1]
            elif name == "BATCH_MATMUL":  # a [..., M, K] (or [..., K, M] when adjX)
                a = shape(op.inputs[0])
                k = a[-2] if getattr(op.builtinOptions, "adjX", False) else a[-1]
            elif name == "DEPTHWISE_CONV_2D":  # filter [1, kh, kw, channels]
                f = shape(op.inputs[1])
                k = f[1] * f[2]
            else:
                continue
            out[name] += 2 * result * k
    return dict(sorted(out.items()))
