"""LiteRT's C API over ctypes: a graph compiled for the GPU accelerator at a precision the Python
wrapper cannot select.

ai-edge-litert's Python wrapper sets the GPU accelerator's precision to fp16 or fp32 only
(`gpu_options.enforce_f32`). The accelerator also has fp16 storage with fp32 accumulation
(`kLiteRtDelegatePrecisionFp16WithFp32Accum`), read from an opaque options entry `gpu_options`
whose payload is TOML text. The `libLiteRt.so` beside the wrapper exports the C API that reaches
it: environment (with the runtime library directory, so that the accelerator's shared library
beside it is found), model from file, options with the GPU accelerator and the opaque entry,
compiled model, managed tensor buffers from the compiled model's requirements, run.

The runtime ignores a payload it cannot parse (it logs and compiles in fp16): a precision is shown
by its effect (scripts/litert/precision_probe.py), never assumed from the option. Struct layouts are
LiteRT's `litert/c/*.h` (2.2 / 2.3, 64-bit). Every symbol used is looked up when the library is
first loaded: another ai-edge-litert without one is one ClefError naming it, before any graph.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scripts.pipeline.errors import ClefError

# The GPU modes, by our name: the LiteRtDelegatePrecision value set through the C API and the enum's
# name in LiteRT's C/C++ API (litert_common.h), which a device team sets. mixed = fp16 storage with
# fp32 accumulation (FULLY_CONNECTED, BATCH_MATMUL, convolutions).
PRECISION = {"fp32": 2, "fp16": 1, "mixed": 3}
PRECISION_NAMES = {
    "fp32": "kLiteRtDelegatePrecisionFp32",
    "fp16": "kLiteRtDelegatePrecisionFp16",
    "mixed": "kLiteRtDelegatePrecisionFp16WithFp32Accum",
}
MODES = tuple(PRECISION)


def check_mode(mode: str) -> str:
    """A GPU mode name, or one ClefError line naming the choices."""
    if mode not in MODES:
        raise ClefError(f"unknown GPU precision {mode!r}: one of {', '.join(MODES)}")
    return mode


GPU_OPTIONS_ID = b"gpu_options"
HW_GPU, HW_CPU = 1 << 1, 1 << 0
ENV_RUNTIME_LIBRARY_DIR = 22  # kLiteRtEnvOptionTagRuntimeLibraryDir
ANY_STRING = 8  # kLiteRtAnyTypeString
LOCK_READ, LOCK_WRITE = 0, 1
ELEMENT_FLOAT32 = 1
MAX_RANK = 8

_handle = ctypes.c_void_p
_status = ctypes.c_int
_size = ctypes.c_size_t


class _Any(ctypes.Structure):  # LiteRtAny: 16 bytes, the value at offset 8
    _fields_ = [("type", ctypes.c_int), ("value", ctypes.c_int64)]


class _EnvOption(ctypes.Structure):  # LiteRtEnvOption: 24 bytes
    _fields_ = [("tag", ctypes.c_int), ("value", _Any)]


class _Layout(ctypes.Structure):  # LiteRtLayout: rank (7 bits) and has_strides (1 bit), dims, strides
    _fields_ = [
        ("rank_bits", ctypes.c_uint32),
        ("dimensions", ctypes.c_int32 * MAX_RANK),
        ("strides", ctypes.c_uint32 * MAX_RANK),
    ]


class _RankedTensorType(ctypes.Structure):  # LiteRtRankedTensorType: 72 bytes
    _fields_ = [("element_type", ctypes.c_int), ("layout", _Layout)]


SIZES = {_Any: 16, _EnvOption: 24, _Layout: 68, _RankedTensorType: 72}

# name -> argument types (every function returns LiteRtStatus unless listed in VOID)
SIGNATURES = {
    "LiteRtCreateEnvironment": [ctypes.c_int, ctypes.POINTER(_EnvOption), ctypes.POINTER(_handle)],
    "LiteRtDestroyEnvironment": [_handle],
    "LiteRtCreateModelFromFile": [_handle, ctypes.c_char_p, ctypes.POINTER(_handle)],
    "LiteRtDestroyModel": [_handle],
    "LiteRtGetNumModelSignatures": [_handle, ctypes.POINTER(_size)],
    "LiteRtGetModelSignature": [_handle, _size, ctypes.POINTER(_handle)],
    "LiteRtGetSignatureKey": [_handle, ctypes.POINTER(ctypes.c_char_p)],
    "LiteRtGetNumSignatureInputs": [_handle, ctypes.POINTER(_size)],
    "LiteRtGetNumSignatureOutputs": [_handle, ctypes.POINTER(_size)],
    "LiteRtGetSignatureInputName": [_handle, _size, ctypes.POINTER(ctypes.c_char_p)],
    "LiteRtGetSignatureOutputName": [_handle, _size, ctypes.POINTER(ctypes.c_char_p)],
    "LiteRtCreateOptions": [ctypes.POINTER(_handle)],
    "LiteRtDestroyOptions": [_handle],
    "LiteRtSetOptionsHardwareAccelerators": [_handle, ctypes.c_int],
    "LiteRtCreateOpaqueOptions": [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_handle)],
    "LiteRtAddOpaqueOptions": [_handle, _handle],
    "LiteRtCreateCompiledModel": [_handle, _handle, _handle, ctypes.POINTER(_handle)],
    "LiteRtDestroyCompiledModel": [_handle],
    "LiteRtCompiledModelIsFullyAccelerated": [_handle, ctypes.POINTER(ctypes.c_bool)],
    "LiteRtGetCompiledModelInputBufferRequirements": [_handle, _size, _size, ctypes.POINTER(_handle)],
    "LiteRtGetCompiledModelOutputBufferRequirements": [_handle, _size, _size, ctypes.POINTER(_handle)],
    "LiteRtCreateManagedTensorBufferFromRequirements": [
        _handle,
        ctypes.POINTER(_RankedTensorType),
        _handle,
        ctypes.POINTER(_handle),
    ],
    "LiteRtDestroyTensorBuffer": [_handle],
    "LiteRtLockTensorBuffer": [_handle, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
    "LiteRtUnlockTensorBuffer": [_handle],
    "LiteRtRunCompiledModel": [_handle, _size, _size, ctypes.POINTER(_handle), _size, ctypes.POINTER(_handle)],
}
VOID = {
    "LiteRtDestroyEnvironment",
    "LiteRtDestroyModel",
    "LiteRtDestroyOptions",
    "LiteRtDestroyCompiledModel",
    "LiteRtDestroyTensorBuffer",
}
# The opaque payload's destructor: the payload is a Python-owned buffer kept alive by its graph, so
# the runtime's call to free it does nothing. Module-level, so the callback outlives every options.
_LIBRARY_DIR = None
_KEEP_PAYLOAD = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _p: None)


def library_path() -> Path:
    """libLiteRt.so of the installed ai-edge-litert (the directory also holds the GPU accelerator)."""
    import importlib.util

    spec = importlib.util.find_spec("ai_edge_litert")
    if spec is None or spec.origin is None:
        raise ClefError("ai-edge-litert is not installed: no libLiteRt.so for the GPU route")
    path = Path(spec.origin).parent / "libLiteRt.so"
    if not path.is_file():
        raise ClefError(f"no {path}: this ai-edge-litert ships no LiteRT C API library")
    return path


def missing_symbols(lib) -> list[str]:
    """The C API functions the route needs that `lib` does not export."""
    return [name for name in SIGNATURES if not hasattr(lib, name)]


@functools.cache
def library() -> ctypes.CDLL:
    """libLiteRt.so loaded, every symbol of SIGNATURES typed; a missing one is a ClefError naming it."""
    for struct, size in SIZES.items():
        if ctypes.sizeof(struct) != size:
            raise ClefError(f"LiteRT C API: {struct.__name__} is {ctypes.sizeof(struct)} bytes here, not {size}")
    global _LIBRARY_DIR
    path = library_path()
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    _LIBRARY_DIR = ctypes.create_string_buffer(str(path.parent).encode())  # read by every environment
    missing = missing_symbols(lib)
    if missing:
        raise ClefError(
            f"{path} does not export {missing[0]} ({len(missing)} C API functions missing): "
            "the GPU route needs the ai-edge-litert pinned in requirements.txt"
        )
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None if name in VOID else _status
    return lib


# LiteRtStatus values (litert_common.h) a failure is most likely to carry
STATUS = {
    1: "invalid argument",
    2: "memory allocation failure",
    3: "runtime failure",
    5: "unsupported",
    6: "not found",
    7: "timeout expired",
    500: "file I/O",
    501: "invalid flatbuffer",
    502: "dynamic loading",
    504: "compilation",
}


def check(status: int, what: str) -> None:
    if status != 0:
        raise ClefError(f"LiteRT C API {what}: status {status} ({STATUS.get(status, 'see the runtime log')})")


def create_environment() -> int:
    """A LiteRT environment told where the runtime's libraries are, so that the GPU accelerator's is
    found. One per compiled graph, as the Python wrapper makes them: the accelerator's device memory
    is set up inside it and goes with it (a sectioned graph frees each section's)."""
    lib = library()
    option = _EnvOption(ENV_RUNTIME_LIBRARY_DIR, _Any(ANY_STRING, ctypes.cast(_LIBRARY_DIR, ctypes.c_void_p).value))
    env = _handle()
    check(lib.LiteRtCreateEnvironment(1, ctypes.byref(option), ctypes.byref(env)), "CreateEnvironment")
    return env.value


def gpu_payload(precision: int) -> bytes:
    """The `gpu_options` TOML text for a LiteRtDelegatePrecision value."""
    return f"precision = {int(precision)}\n".encode()


@dataclass
class Signature:
    index: int
    key: str
    inputs: list[str]
    outputs: list[str]
    input_shapes: dict[str, list[int]]
    output_shapes: dict[str, list[int]]  # a name may be an input and an output, of other shapes


Signatures = dict[str, Signature]
"""Signature key -> the signature: what a compiled model runs."""

SignatureList = dict[str, dict[str, list[str]]]
"""Signature key -> {"inputs" | "outputs": tensor names}, as ai_edge_litert's get_signature_list gives it."""

OutputDetails = dict[str, dict[str, list[int]]]
"""Output name -> {"shape": dims}: what ai_edge_litert's get_output_tensor_details gives that its runner reads."""


def _names(lib, sig, count_fn, name_fn) -> list[str]:
    n = _size()
    check(getattr(lib, count_fn)(sig, ctypes.byref(n)), count_fn)
    out = []
    for i in range(n.value):
        name = ctypes.c_char_p()
        check(getattr(lib, name_fn)(sig, i, ctypes.byref(name)), name_fn)
        out.append(name.value.decode())
    return out


def signature_shapes(source) -> dict[str, dict[str, dict[str, list[int]]]]:
    """{signature key: {"inputs" | "outputs": {name: shape}}} from the file's own signature defs
    (`source`: a .tflite path, or a flatbuffer head already read). Not from the C API: its look-ups by
    name resolve a name that is both an input and an output of a signature (a pair's suffix takes and
    returns `attn3_k`) to the output, in the model and in the compiled model alike."""
    from ai_edge_litert import schema_py_generated as schema

    from scripts.litert import tflite_file

    head = source if isinstance(source, (bytes, bytearray)) else tflite_file.read_head(source)
    model = schema.Model.GetRootAs(head, 0)
    out = {}
    for i in range(model.SignatureDefsLength()):
        sig = model.SignatureDefs(i)
        sub = model.Subgraphs(sig.SubgraphIndex())

        def shapes(n, get, sub=sub):
            return {
                get(k).Name().decode(): [int(d) for d in sub.Tensors(get(k).TensorIndex()).ShapeAsNumpy()]
                for k in range(n)
            }

        out[sig.SignatureKey().decode()] = {
            "inputs": shapes(sig.InputsLength(), sig.Inputs),
            "outputs": shapes(sig.OutputsLength(), sig.Outputs),
        }
    return out


def ranked_type(shape: list[int]) -> _RankedTensorType:
    """A float32 LiteRtRankedTensorType of `shape` (the runner feeds and reads float32)."""
    if len(shape) > MAX_RANK:
        raise ClefError(f"a tensor of rank {len(shape)}: LiteRT's layouts hold at most {MAX_RANK}")
    layout = _Layout()
    layout.rank_bits = len(shape)
    for k, d in enumerate(shape):
        layout.dimensions[k] = d
    return _RankedTensorType(ELEMENT_FLOAT32, layout)


class Buffer:
    """A managed tensor buffer of float32 values (owned by its CompiledGraph)."""

    def __init__(self, handle: int):
        self.handle = handle

    def write(self, array: np.ndarray) -> None:
        lib, data = library(), np.ascontiguousarray(array, dtype=np.float32)
        addr = ctypes.c_void_p()
        check(lib.LiteRtLockTensorBuffer(self.handle, ctypes.byref(addr), LOCK_WRITE), "LockTensorBuffer (write)")
        try:
            ctypes.memmove(addr.value, data.ctypes.data, data.nbytes)
        finally:
            check(lib.LiteRtUnlockTensorBuffer(self.handle), "UnlockTensorBuffer")

    def read(self, count: int, dtype=np.float32) -> np.ndarray:
        """`count` float32 values; locking waits for the run that writes them. A lock that fails is
        the runtime's "Failed to lock" (a RuntimeError, as the wrapper raises it)."""
        lib = library()
        out = np.empty(count, dtype=np.float32)
        addr = ctypes.c_void_p()
        status = lib.LiteRtLockTensorBuffer(self.handle, ctypes.byref(addr), LOCK_READ)
        if status != 0:
            raise RuntimeError(f"Failed to lock custom tensor buffer (LiteRtLockTensorBuffer status {status})")
        try:
            ctypes.memmove(out.ctypes.data, addr.value, out.nbytes)
        finally:
            check(lib.LiteRtUnlockTensorBuffer(self.handle), "UnlockTensorBuffer")
        return out.astype(dtype, copy=False)


class CompiledGraph:
    """A `.tflite` compiled through the C API on `accelerators` (HW_GPU alone by default), with the
    GPU accelerator's precision set to `precision` (a LiteRtDelegatePrecision value; None: no
    gpu_options entry) or, for a test, to the raw `payload` text."""

    def __init__(self, path, precision: int | None, accelerators: int = HW_GPU, payload: bytes | None = None):
        lib = library()
        self.path, self.precision = Path(path), precision
        self._env = self._model = self._options = self._compiled = None
        self._buffers: list[int] = []
        self._env = env = create_environment()
        model = _handle()
        check(lib.LiteRtCreateModelFromFile(env, str(self.path).encode(), ctypes.byref(model)), f"model {self.path}")
        self._model = model.value
        options = _handle()
        check(lib.LiteRtCreateOptions(ctypes.byref(options)), "CreateOptions")
        self._options = options.value
        check(lib.LiteRtSetOptionsHardwareAccelerators(self._options, accelerators), "SetOptionsHardwareAccelerators")
        text = payload if payload is not None else (gpu_payload(precision) if precision is not None else None)
        if text is not None:
            self._payload = ctypes.create_string_buffer(text)  # alive as long as the graph
            opaque = _handle()
            check(
                lib.LiteRtCreateOpaqueOptions(
                    GPU_OPTIONS_ID,
                    ctypes.cast(self._payload, ctypes.c_void_p),
                    ctypes.cast(_KEEP_PAYLOAD, ctypes.c_void_p),
                    ctypes.byref(opaque),
                ),
                "CreateOpaqueOptions",
            )
            check(lib.LiteRtAddOpaqueOptions(self._options, opaque), "AddOpaqueOptions")
        compiled = _handle()
        status = lib.LiteRtCreateCompiledModel(env, self._model, self._options, ctypes.byref(compiled))
        if status != 0:
            self.close()
            check(status, f"CreateCompiledModel {self.path.name}")
        self._compiled = compiled.value
        self.signatures: Signatures = self._signatures()

    def _signatures(self) -> Signatures:
        lib, from_file, self._types = library(), signature_shapes(self.path), {}
        n = _size()
        check(lib.LiteRtGetNumModelSignatures(self._model, ctypes.byref(n)), "GetNumModelSignatures")
        out = {}
        for index in range(n.value):
            sig = _handle()
            check(lib.LiteRtGetModelSignature(self._model, index, ctypes.byref(sig)), "GetModelSignature")
            key = ctypes.c_char_p()
            check(lib.LiteRtGetSignatureKey(sig, ctypes.byref(key)), "GetSignatureKey")
            inputs = _names(lib, sig, "LiteRtGetNumSignatureInputs", "LiteRtGetSignatureInputName")
            outputs = _names(lib, sig, "LiteRtGetNumSignatureOutputs", "LiteRtGetSignatureOutputName")
            found = from_file.get(key.value.decode())
            if found is None or set(found["inputs"]) != set(inputs) or set(found["outputs"]) != set(outputs):
                raise ClefError(
                    f"{self.path}: signature {key.value.decode()!r} differs between the runtime and the file"
                )
            for group, names in (("inputs", inputs), ("outputs", outputs)):
                for name in names:
                    self._types[(index, group, name)] = ranked_type(found[group][name])
            out[key.value.decode()] = Signature(
                index, key.value.decode(), inputs, outputs, found["inputs"], found["outputs"]
            )
        return out

    # The interface of ai_edge_litert's CompiledModel that gpu_accelerator.signature_runner uses, so
    # that one runner (its retries and its one-line failures) serves both routes.

    def get_signature_list(self) -> SignatureList:
        return {k: {"inputs": list(s.inputs), "outputs": list(s.outputs)} for k, s in self.signatures.items()}

    def get_signature_index(self, key: str) -> int:
        return self.signatures[key].index

    def _signature(self, index: int) -> Signature:
        return next(s for s in self.signatures.values() if s.index == index)

    def get_output_tensor_details(self, key: str) -> OutputDetails:
        sig = self.signatures[key]
        return {n: {"shape": sig.output_shapes[n]} for n in sig.outputs}

    def is_fully_accelerated(self) -> bool:
        flag = ctypes.c_bool()
        check(library().LiteRtCompiledModelIsFullyAccelerated(self._compiled, ctypes.byref(flag)), "IsFullyAccelerated")
        return bool(flag.value)

    def _buffers_for(self, index: int, outputs: bool) -> list[Buffer]:
        """Managed tensor buffers for a signature's inputs or outputs, from the compiled model's
        requirements (on the GPU: the accelerator's own buffers); destroyed by close()."""
        lib, sig = library(), self._signature(index)
        fn = (
            "LiteRtGetCompiledModelOutputBufferRequirements"
            if outputs
            else "LiteRtGetCompiledModelInputBufferRequirements"
        )
        made = []
        for i, name in enumerate(sig.outputs if outputs else sig.inputs):
            req = _handle()
            check(getattr(lib, fn)(self._compiled, index, i, ctypes.byref(req)), fn)
            buf = _handle()
            ranked = self._types[(index, "outputs" if outputs else "inputs", name)]
            check(
                lib.LiteRtCreateManagedTensorBufferFromRequirements(
                    self._env, ctypes.byref(ranked), req, ctypes.byref(buf)
                ),
                f"CreateManagedTensorBufferFromRequirements {name}",
            )
            self._buffers.append(buf.value)
            made.append(Buffer(buf.value))
        return made

    def create_input_buffers(self, index: int) -> list[Buffer]:
        return self._buffers_for(index, outputs=False)

    def create_output_buffers(self, index: int) -> list[Buffer]:
        return self._buffers_for(index, outputs=True)

    def run_by_index(self, index: int, inputs: list[Buffer], outputs: list[Buffer]) -> None:
        arr_in = (_handle * len(inputs))(*(b.handle for b in inputs))
        arr_out = (_handle * len(outputs))(*(b.handle for b in outputs))
        status = library().LiteRtRunCompiledModel(self._compiled, index, len(inputs), arr_in, len(outputs), arr_out)
        if status != 0:
            raise RuntimeError(f"LiteRtRunCompiledModel: status {status} ({STATUS.get(status, 'see the runtime log')})")

    def close(self) -> None:
        """Destroy buffers, compiled model, options and model (idempotent)."""
        lib = library()
        for b in self._buffers:
            lib.LiteRtDestroyTensorBuffer(b)
        self._buffers = []
        if self._compiled:
            lib.LiteRtDestroyCompiledModel(self._compiled)
        if self._options:
            lib.LiteRtDestroyOptions(self._options)
        if self._model:
            lib.LiteRtDestroyModel(self._model)
        if self._env:
            lib.LiteRtDestroyEnvironment(self._env)
        self._compiled = self._options = self._model = self._env = None
