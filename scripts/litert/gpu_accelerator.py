"""LiteRT's GPU accelerator (ML Drift over WebGPU): compile a graph for it alone in one of three
modes, run its signatures, and say what it refused and which adapter ran it.

Modes (MODES): `fp32`, `fp16` (the accelerator's default arithmetic: fp16 storage and accumulation)
and `mixed` (fp16 storage, fp32 accumulation in FULLY_CONNECTED, BATCH_MATMUL and convolutions).
The Python wrapper reaches only the first two, so compiling goes through LiteRT's C API
(scripts/litert/litert_c.py), which sets the precision in the accelerator's `gpu_options`. The
runtime ignores an option it cannot parse, so `prove_mode` shows each mode by its effect on a
one-op probe graph (scripts/litert/precision_probe.py), compiled with the same options payload.

The accelerator reports from C++ on the process's stderr: the adapter it selected, and the ops it
refused ("Following operations are not supported by GPU delegate: BROADCAST_TO: ..."). Those lines
are the only place the truth is told (LiteRT's own ModelAnalyzer passes graphs the accelerator
refuses), so `compile` captures file descriptor 2 while it runs and parses it.

On a machine without a GPU, Mesa's software Vulkan driver (lavapipe) gives Dawn an adapter. Without
any adapter the accelerator cannot start: that is one ClefError naming what to install, never a
silent run on the CPU. Graphs are compiled for the GPU alone (no CPU fallback), so "compiled" means
"fully accelerated"; `is_fully_accelerated()` is recorded as well.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scripts.litert import litert_c, tflite_file
from scripts.pipeline import profile
from scripts.pipeline.errors import ClefError
from scripts.pipeline.records import Record

INSTALL_HINT = (
    "no Vulkan adapter for LiteRT's GPU accelerator: install Mesa's Vulkan driver >= 25 "
    "(`make env` does it as root on Debian 12/13: mesa-vulkan-drivers, from bookworm-backports on 12) "
    "or run on a machine with a GPU"
)
_ADAPTER = re.compile(r"Selected adapter: (.+?)(?:, arch=|$)", re.M)
REFUSED_HEAD = "Following operations are not supported by GPU delegate:"
FALLBACK = re.compile(r"(\d+) operations will run on the GPU, and the remaining (\d+) operations will run on the CPU")
# Dawn's WebGPU validation of what the accelerator asked of the device, e.g. "Binding size (201326592) of
# [Buffer (unlabeled)] is larger than the maximum storage buffer binding size (134217728)": the
# accelerator logs it and goes on, computing wrong (tests/test_gpu_accelerator.py).
_VALIDATION = re.compile(r"Validation error: (.+)")
# Reading an output waits for the run about two minutes, then fails with this. On a software GPU a first
# run (its shaders compiled as it goes) or a starved process can take longer: the run is repeated on
# fresh output buffers (the previous run queued ahead of it, its shaders compiled), RUN_ATTEMPTS in all.
LOCK_TIMEOUT = "Failed to lock custom tensor buffer"
RUN_ATTEMPTS = 3
# The accelerator's kernel builder refusing a graph it accepted op by op, e.g. a FULLY_CONNECTED whose
# weight is the DEQUANTIZE of an int8 constant: "Shape mismatch: {bhwc, {256, 1, 1, 1024}} vs ..."
# (a float16 constant's DEQUANTIZE it folds into the weight; an int8 one it does not).
_KERNEL = re.compile(r"Failed to create litert::ml_drift::DelegateKernelLiteRt: (.+)")
# the versions seen ending the process (free(): invalid next size) on a blockwise int4 FULLY_CONNECTED weight
BLOCKWISE_ABORTS_IN = "2.3.0 and 2.4.0.dev20261026"
_NO_ADAPTER = ("No adapters found", "Failed to create WebGPU", "No GPU adapter", "Failed to create a WebGPU")


@contextlib.contextmanager
def captured_stderr():
    """Redirect file descriptor 2 (where the C++ runtime logs) to a file for the block;
    -> a dict whose "text" holds what was written once the block ends."""
    out: dict = {"text": ""}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out["text"] = f.read().decode(errors="replace")


def refused_ops(log: str) -> list[str]:
    """The ops the accelerator refused, as "OP: reason", in the order it listed them."""
    ops: list[str] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if REFUSED_HEAD in line:
            for nxt in lines[i + 1 :]:
                if not re.match(r"^[A-Z0-9_]+: ", nxt.strip()):
                    break
                if nxt.strip() not in ops:
                    ops.append(nxt.strip())
    return ops


def adapter_name(log: str) -> str | None:
    m = _ADAPTER.search(log)
    return m.group(1).strip() if m else None


MODES, check_mode = litert_c.MODES, litert_c.check_mode


@dataclass
class Compiled:
    """One graph compiled for the GPU accelerator alone, in one of MODES."""

    path: Path
    mode: str
    model: object
    adapter: str
    fully_accelerated: bool
    log: str = field(repr=False)

    def close(self) -> None:
        """Release the compiled model now, with the runtime's teardown log kept off stderr (it logs
        every accelerator it destroys)."""
        with captured_stderr():
            if self.model is not None and hasattr(self.model, "close"):
                self.model.close()
            self.model = None
            gc.collect()

    def signature(self, name: str | None = None):
        """A signature as a callable on named torch tensors (or numpy arrays) -> {output name: float32
        tensor}: the checks compute on torch; torch is imported when a signature is made."""
        import torch

        run = signature_runner(self.model, self.path, name, quiet_runs=True)

        def call(**feeds):
            out = run(**{k: v.detach().cpu().numpy() if hasattr(v, "detach") else v for k, v in feeds.items()})
            return {k: torch.from_numpy(v) for k, v in out.items()}

        return call


def signature_runner(model, path, name: str | None = None, quiet_runs: bool = False, part: str = "GPU runs"):
    """Signature `name` (the only one when None) of a CompiledModel as a callable on named float32 numpy
    arrays -> {output name: float32 numpy array}. The runtime logs from C++ on fd 2: the first call
    (where it finishes setting itself up) always runs with stderr captured, every call with quiet_runs
    (the GPU accelerator logs each run). Each call's time counts to profile `part`."""
    sigs = model.get_signature_list()
    key = name if name is not None else next(iter(sigs))
    if key not in sigs:
        raise ClefError(f"{path}: no signature {key!r} (has {sorted(sigs)})")
    index = model.get_signature_index(key)
    inputs, outputs = sigs[key]["inputs"], sigs[key]["outputs"]
    shapes = {n: [int(d) for d in detail["shape"]] for n, detail in model.get_output_tensor_details(key).items()}
    in_bufs, out_bufs = model.create_input_buffers(index), [model.create_output_buffers(index)]

    def run_once(feeds):
        missing = sorted(set(inputs) - set(feeds))
        if missing:
            raise ClefError(f"{path} [{key}]: inputs {missing} not given")
        for buf, n in zip(in_bufs, inputs, strict=True):
            buf.write(np.ascontiguousarray(feeds[n], dtype=np.float32))
        for attempt in range(1, RUN_ATTEMPTS + 1):
            model.run_by_index(index, in_bufs, out_bufs[0])
            try:
                return {
                    n: buf.read(int(np.prod(shapes[n])), np.float32).reshape(shapes[n])
                    for buf, n in zip(out_bufs[0], outputs, strict=True)
                }
            except RuntimeError as exc:  # a buffer that failed to lock stays locked: fresh ones, a new run
                if LOCK_TIMEOUT not in str(exc) or attempt == RUN_ATTEMPTS:
                    raise
                out_bufs[0] = model.create_output_buffers(index)

    first = [True]

    def run(**feeds):
        quiet, first[0] = quiet_runs or first[0], False
        with profile.part(part), captured_stderr() if quiet else contextlib.nullcontext({"text": ""}) as log:
            try:
                return run_once(feeds)
            except RuntimeError as exc:  # the runtime's reason is in its log, which the capture holds
                failed = exc
        raise ClefError(f"{path} [{key}]: the run failed: {run_failure(str(failed), log['text'])}")

    return run


def run_failure(error: str, log: str) -> str:
    """One line for a failed run: the runtime's error and, before it, what the device refused (a
    Dawn validation error) or the runtime's last ERROR line, where its log has one."""
    invalid = _VALIDATION.search(log)
    errors = [line.strip() for line in log.splitlines() if "ERROR" in line]
    cause = invalid.group(1).strip() if invalid else (errors[-1] if errors else "")
    return " ".join(f"{cause + '; ' if cause else ''}{error}".split())


def holding(census: dict | None, op: str) -> list[str]:
    """The signatures whose subgraph holds `op` (from tflite_file.census), to name where a refusal is."""
    return [name for name, sig in (census or {}).get("signatures", {}).items() if op in sig.get("ops", {})]


def _quiet_teardown() -> None:
    """At exit, after the last line of ours: the runtime logs every accelerator it destroys on fd 2,
    which would follow a stage's one-line error. Send fd 2 to /dev/null for the teardown."""
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def quiet_teardown_at_exit() -> None:
    """_quiet_teardown once at exit, however many graphs are compiled."""
    atexit.unregister(_quiet_teardown)
    atexit.register(_quiet_teardown)


def load(path, accelerators, fp32: bool = True) -> tuple:
    """The Python wrapper's route: CompiledModel.from_file on `accelerators` (HardwareAccelerator
    flags), fp32 = enforce_f32, with the runtime's log captured; -> (model or None, log text, the
    runtime's error or None). For the CPU accelerator and the GPU with CPU fallback (the peers'
    benchmark); a graph for the GPU alone is compiled by `compile`, which reaches every mode."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.options import Options

    quiet_teardown_at_exit()
    options = Options(hardware_accelerators=accelerators)
    options.gpu_options.enforce_f32 = fp32
    model, error = None, None
    with captured_stderr() as log:
        try:
            model = CompiledModel.from_file(str(path), options=options)
        except RuntimeError as exc:
            error = " ".join(str(exc).split())
    return model, log["text"], error


def compile(path, mode: str = "fp32", census: dict | None = None) -> Compiled:  # noqa: A001  (the accelerator's word)
    """Compile `path` for the GPU accelerator alone in `mode` (one of MODES) through LiteRT's C API.
    A refused op (named with the signatures that hold it, given the file's census), a partial
    acceleration or a missing adapter is a ClefError naming it."""
    path = Path(path)
    check_mode(mode)
    if not path.is_file():
        raise ClefError(f"no {path} to compile for the GPU")
    from scripts.litert import weight_storage

    if found := weight_storage.blockwise(census or tflite_file.census(path)):
        raise ClefError(
            f"{path}: FULLY_CONNECTED weights stored {', '.join(found)}: not handed to the GPU accelerator, "
            f"which aborts the process on blockwise weights (ai-edge-litert {BLOCKWISE_ABORTS_IN}); int4 per "
            "output row (weights int4) is what it reads"
        )
    with captured_stderr():  # loading logs what the runtime looks for; a missing symbol is a ClefError
        litert_c.library()
    quiet_teardown_at_exit()
    model, error = None, None
    with profile.part("GPU compile"), captured_stderr() as log:
        try:
            model = litert_c.CompiledGraph(path, litert_c.PRECISION[mode])
            accelerated = model.is_fully_accelerated()
        except ClefError as exc:
            error = " ".join(str(exc).split())
    text = log["text"]
    name = adapter_name(text)
    if name is None or any(s in text for s in _NO_ADAPTER):
        raise ClefError(f"{path}: {INSTALL_HINT}")
    refused = refused_ops(text)
    invalid = _VALIDATION.search(text)
    if invalid and not refused and error is None:
        model.close()
        raise ClefError(
            f"{path} ({mode}): the device refused what the GPU accelerator asked of it on {name}: "
            + invalid.group(1).strip()
        )
    if refused or error is not None:
        if model is not None:
            model.close()
        fallback = FALLBACK.search(text)
        counts = (
            f"; {fallback.group(2)} of {int(fallback.group(1)) + int(fallback.group(2))} ops would run on the CPU"
            if fallback
            else ""
        )
        where = holding(census, refused[0].split(":")[0]) if refused else []
        kernel = _KERNEL.search(text)
        first = (
            f"first refused op {refused[0]}" + (f" in signature {', '.join(where)}" if where else "")
            if refused
            else f"the accelerator said: {error}" + (f" ({kernel.group(1).strip()})" if kernel else "")
        )
        raise ClefError(f"{path} ({mode}): not compiled for the GPU accelerator alone on {name}: {first}{counts}")
    return Compiled(path, mode, model, name, bool(accelerated), text)


@dataclass(frozen=True)
class ModeProof(Record):
    """A mode shown by its effect: the precision probe's error against float64 and the arithmetic it
    says was used (scripts/litert/precision_probe.py); verify_gpu records it as each mode's `probe`."""

    mode: str
    probe_error: float
    arithmetic: str


def prove_mode(mode: str) -> ModeProof:
    """Compile the precision probe in `mode` the way every graph is compiled (the same options
    payload) and run it: a ClefError when its error is not `mode`'s arithmetic (an option the runtime
    ignored or does not honour), naming what it computed instead."""
    from scripts.litert import precision_probe

    check_mode(mode)
    compiled = compile(precision_probe.graph_path(), mode)
    try:
        y = compiled.signature("probe")(x=precision_probe.inputs()[0])["y"].numpy()
    finally:
        compiled.close()
    err = precision_probe.error(y)
    found = precision_probe.arithmetic(err)
    if found != mode:
        raise ClefError(
            f"GPU mode {mode} did not take effect on {compiled.adapter}: the precision probe's error {err:.2e} "
            f"is {found} arithmetic's (edges {precision_probe.CLASS_EDGES[0]:g}, {precision_probe.CLASS_EDGES[1]:g}); "
            "this runtime ignores or does not honour the precision option"
        )
    return ModeProof(mode, err, found)


def driver_info() -> str | None:
    """The Vulkan driver's own description (`vulkaninfo --summary`: driverName and driverInfo), or None
    when vulkan-tools is not installed."""
    import shutil
    import subprocess

    if shutil.which("vulkaninfo") is None:
        return None
    try:
        text = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    fields = dict(re.findall(r"^\s*(driverName|driverInfo|deviceName)\s*=\s*(.+)$", text, re.M))
    return " / ".join(fields[k] for k in ("deviceName", "driverName", "driverInfo") if k in fields) or None


@dataclass(frozen=True)
class GpuDevice(Record):
    """What ran a graph (`device`): the adapter, the line Dawn's log selects it with, the Vulkan
    driver (None without vulkan-tools), and whether it is a software one; verify_gpu's `device`."""

    adapter: str
    selected: str
    driver: str | None
    software: bool


def device(compiled: Compiled) -> GpuDevice:
    """What ran a graph: the adapter Dawn selected (as its log names it) and the Vulkan driver."""
    line = next((ln for ln in compiled.log.splitlines() if "Selected adapter:" in ln), "")
    return GpuDevice(
        adapter=compiled.adapter,
        selected=line.split("Selected adapter:", 1)[-1].strip(),
        driver=driver_info(),
        software="adapterType=CPU" in line or "arch=software" in line,
    )
