"""Reading a `.tflite` file itself: its op census, and the provenance metadata we embed in it.

The census is what GPU delegates and stock interpreters care about, read from the flatbuffer rather
than trusted from the converter: every op with its count, the largest tensor rank, the tensor dtypes,
and the ops of each GatedDeltaNet layer (attributed through the source-module paths the converter
writes into tensor names). `violations()` lists what makes a model unfit: a tensor of rank > 4, a
custom op, a STABLEHLO_* op, WHILE, CUMSUM, GATHER_ND, an int64 tensor.
"""
from __future__ import annotations

import collections
import json
import re

from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

METADATA_NAME = "clef_litert"
BANNED_OPS = ("WHILE", "CUMSUM", "GATHER_ND")
MAX_RANK = 4
_OP_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
_TYPE_NAMES = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
_GDN_LAYER = re.compile(r"DecoderLayer_(\d+)/[^/;]*ClefGatedDeltaNet")


def read_artifact(path, producer: str) -> bytes:
    """The bytes of an artifact a stage checks, or one line naming the stage that makes it."""
    from pathlib import Path

    from scripts.errors import ClefError

    path = Path(path)
    if not path.is_file():
        raise ClefError(f"no {path}: run the {producer} stage first")
    return path.read_bytes()


def _name(x) -> str:
    return x.decode() if isinstance(x, bytes) else (x or "")


def op_name(model, op) -> str:
    code = model.operatorCodes[op.opcodeIndex]
    builtin = flatbuffer_utils.get_builtin_code_from_operator_code(code)
    if builtin == schema.BuiltinOperator.CUSTOM:
        return f"CUSTOM:{_name(code.customCode)}"
    return _OP_NAMES.get(builtin, f"UNKNOWN_{builtin}")


def census(content: bytes) -> dict:
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    ops = collections.Counter()
    dtypes = collections.Counter()
    max_rank = 0
    per_gdn = collections.Counter()
    for sg in model.subgraphs:
        for t in sg.tensors:
            dtypes[_TYPE_NAMES.get(t.type, str(t.type))] += 1
            max_rank = max(max_rank, len(t.shape) if t.shape is not None else 0)
        for op in sg.operators:
            ops[op_name(model, op)] += 1
            first_path = _name(sg.tensors[op.outputs[0]].name).split(";")[0] if len(op.outputs) else ""
            if m := _GDN_LAYER.search(first_path):
                per_gdn[int(m.group(1))] += 1
    signatures = {}
    for sig in model.signatureDefs or []:
        sg = model.subgraphs[sig.subgraphIndex]

        def io(entries):
            return [{"name": _name(e.name), "shape": [int(d) for d in sg.tensors[e.tensorIndex].shape],
                     "dtype": _TYPE_NAMES.get(sg.tensors[e.tensorIndex].type, "?").lower()} for e in entries]

        signatures[_name(sig.signatureKey)] = {"inputs": io(sig.inputs), "outputs": io(sig.outputs)}
    return {
        "ops": dict(sorted(ops.items())),
        "op_total": sum(ops.values()),
        "max_rank": max_rank,
        "dtypes": dict(sorted(dtypes.items())),
        "subgraphs": len(model.subgraphs),
        "ops_per_gdn_layer": {str(k): v for k, v in sorted(per_gdn.items())},
        "signatures": signatures,
    }


def violations(c: dict) -> list[str]:
    """What makes the model unfit for GPU delegates and stock interpreters, one line each."""
    out = []
    if c["max_rank"] > MAX_RANK:
        out.append(f"a tensor of rank {c['max_rank']} (> {MAX_RANK})")
    for op, n in c["ops"].items():
        if op.startswith("CUSTOM:") or op.startswith("STABLEHLO_") or op in BANNED_OPS:
            out.append(f"op {op} x{n}")
    if c["dtypes"].get("INT64"):
        out.append(f"{c['dtypes']['INT64']} int64 tensors")
    return out


def with_metadata(content: bytes, meta: dict) -> bytes:
    """The model with `meta` (JSON) stored as its metadata entry METADATA_NAME (replacing an old one)."""
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    model.metadata = [m for m in (model.metadata or []) if _name(m.name) != METADATA_NAME]
    buf = schema.BufferT()
    buf.data = list(json.dumps(meta, sort_keys=True).encode())
    model.buffers.append(buf)
    entry = schema.MetadataT()
    entry.name = METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    model.metadata.append(entry)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def read_metadata(content: bytes) -> dict | None:
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    for m in model.metadata or []:
        if _name(m.name) == METADATA_NAME:
            return json.loads(bytes(model.buffers[m.buffer].data).decode())
    return None
