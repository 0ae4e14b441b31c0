"""Which arithmetic a GPU compile really used, shown by its effect on one FULLY_CONNECTED.

The accelerator takes its precision from an options payload it ignores when it cannot parse it
(it logs and compiles in fp16, still "fully accelerated"), so a mode is never assumed from the
option. The probe is one FULLY_CONNECTED [1, 64, K] x [K, 128] with K = 2048, written as a
`.tflite` of its own (no conversion), run on seeded inputs and held against float64. The three
arithmetics sit orders of magnitude apart at this K (measured on lavapipe: fp32 ~1e-6; fp16 storage
with fp32 accumulation ~7e-4, the inputs' fp16 rounding; fp16 accumulation ~1.4e-2, growing with K),
so the error names the arithmetic; `CLASS_EDGES` sit between them (geometric means, >= 4x from each
measured figure).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

K, ROWS, COLUMNS = 2048, 64, 128
# error below the first edge: fp32 arithmetic; below the second: fp16 storage, fp32 accumulation;
# above: fp16 accumulation
CLASS_EDGES = (2.5e-5, 3.0e-3)
ARITHMETIC = ("fp32", "mixed", "fp16")


def _tensor(name: str, shape: list[int], buffer: int):
    t = schema.TensorT()
    t.name, t.shape, t.type, t.buffer = name, shape, schema.TensorType.FLOAT32, buffer
    return t


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """(x [1, ROWS, K], weight [COLUMNS, K]): seeded, unit-variance outputs."""
    rng = np.random.default_rng(20261203)
    x = rng.standard_normal((1, ROWS, K)).astype(np.float32)
    w = (rng.standard_normal((COLUMNS, K)) / np.sqrt(K)).astype(np.float32)
    return x, w


def graph_bytes(weight: np.ndarray) -> bytes:
    """A model of one FULLY_CONNECTED (weight constant, no bias, keep_num_dims), signature `probe`:
    x -> y."""
    model = schema.ModelT()
    model.version, model.description = 3, "clef precision probe"
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 1
    model.operatorCodes = [code]
    empty, data = schema.BufferT(), schema.BufferT()
    data.data = np.frombuffer(np.ascontiguousarray(weight, dtype=np.float32).tobytes(), dtype=np.uint8)
    model.buffers = [empty, data]
    sub = schema.SubGraphT()
    sub.tensors = [_tensor("x", [1, ROWS, K], 0), _tensor("w", [COLUMNS, K], 1), _tensor("y", [1, ROWS, COLUMNS], 0)]
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1, -1], [2]
    op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = schema.FullyConnectedOptionsT()
    op.builtinOptions.keepNumDims = True
    sub.operators, sub.inputs, sub.outputs, sub.name = [op], [0], [2], "probe"
    model.subgraphs = [sub]
    sig = schema.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = "probe", 0
    sig.inputs, sig.outputs = [schema.TensorMapT()], [schema.TensorMapT()]
    sig.inputs[0].name, sig.inputs[0].tensorIndex = "x", 0
    sig.outputs[0].name, sig.outputs[0].tensorIndex = "y", 2
    model.signatureDefs = [sig]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


@functools.cache
def graph_path() -> Path:
    """The probe graph, written once per process to a temporary file."""
    directory = Path(tempfile.mkdtemp(prefix="clef-probe-"))
    path = directory / "precision_probe.tflite"
    path.write_bytes(graph_bytes(inputs()[1]))
    return path


def error(y: np.ndarray) -> float:
    """The probe output's max |y - exact| / max |exact| against float64 (inf when not finite)."""
    x, w = inputs()
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.abs(y.astype(np.float64) - exact).max() / np.abs(exact).max())


def arithmetic(err: float) -> str:
    """The arithmetic an error says was used: fp32, mixed (fp16 storage, fp32 accumulation) or fp16."""
    if err < CLASS_EDGES[0]:
        return "fp32"
    if err < CLASS_EDGES[1]:
        return "mixed"
    return "fp16"
