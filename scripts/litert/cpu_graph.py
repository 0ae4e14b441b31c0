"""A `.tflite` on LiteRT's CPU accelerator (XNNPACK), with its packed weights in a cache file.

The classic interpreter packs a graph's weights for XNNPACK into anonymous memory, once for each
signature: a shared-state pair (prefix and suffix over one copy of the weights) holds them twice,
6.9 GB more for the real-width pair. `CompiledModel` with XNNPACK's weight cache
(`CpuOptions.xnnpack_weight_cache_path`) packs them once into a file every signature shares, which
the kernel maps: nothing is duplicated, and its pages can be dropped and read again like the graph's
own. The cache lives in a temporary directory (TMPDIR) as long as the graph is open: one graph's
worth of disk.

`CpuGraph(path).get_signature_runner(name)` is a callable on named numpy arrays returning a dict of
numpy arrays, as the classic interpreter's signature runner is.

A graph whose FULLY_CONNECTEDs read integer weights themselves (weights int8 and int4, the form the
GPU accelerator keeps packed) runs on the CPU as XNNPACK's dynamic kernels, which round each row of
activations to int8. Every check runs it in its exact form instead (`dynamic_kernels=False`, the
default): the same file with each such weight read through a DEQUANTIZE
(weight_storage.dequantized), written beside the cache, which the CPU folds into float32 weights, so it
computes what torch and the GPU's fp32 mode compute. `dynamic_kernels=True` runs the file as stored:
what a device's CPU runs (clef run, verify_tflite's dynamic-kernels figure, the benchmarks).
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from pathlib import Path

from scripts.litert import gpu_accelerator
from scripts.pipeline import profile
from scripts.pipeline.errors import ClefError

CACHE_FILE = "weights.xnnpack"
EXACT_FILE = "exact.tflite"  # the graph with its integer weights read through a DEQUANTIZE


def default_threads() -> int:
    """torch's thread count where torch is loaded (a stage: the interpreter and torch take the same cores),
    else the cores this process may run on (`clef verify`, which needs no torch)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else len(os.sched_getaffinity(0))


class CpuGraph:
    def __init__(self, path, threads: int | None = None, dynamic_kernels: bool = False):
        self.path, self.model = Path(path), None
        if not self.path.is_file():
            raise ClefError(f"no {self.path} to run")
        with profile.part("LiteRT CPU load"):
            self._load(threads, dynamic_kernels)

    def _load(self, threads: int | None, dynamic_kernels: bool) -> None:
        self._cache = tempfile.TemporaryDirectory(prefix="clef-xnnpack-")
        loaded, self.dequantized = self.path, 0
        if not dynamic_kernels:
            from scripts.litert import weight_storage

            exact = Path(self._cache.name) / EXACT_FILE
            self.dequantized = weight_storage.dequantized(self.path, exact)
            loaded = exact if self.dequantized else self.path
        gpu_accelerator.quiet_teardown_at_exit()
        # the runtime logs on fd 2 from C++ as it creates its environment and registers accelerators
        with gpu_accelerator.captured_stderr() as log:
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.hardware_accelerator import HardwareAccelerator
            from ai_edge_litert.options import Options

            options = Options(hardware_accelerators=HardwareAccelerator.CPU)
            options.cpu_options.num_threads = threads or default_threads()
            options.cpu_options.xnnpack_weight_cache_path = str(Path(self._cache.name) / CACHE_FILE)
            try:
                self.model = CompiledModel.from_file(str(loaded), options=options)
            except RuntimeError as exc:
                error = " ".join(str(exc).split())
            else:
                error = None
        if error is not None:
            self._cache.cleanup()
            raise ClefError(f"{self.path}: LiteRT cannot load it on the CPU: {error}")
        self.log = log["text"]

    def get_signature_runner(self, name: str | None = None):
        """Signature `name` (the only one when None) as a callable on named float32 numpy arrays."""
        return gpu_accelerator.signature_runner(self.model, self.path, name, part="LiteRT CPU runs")

    def close(self) -> None:
        """Release the compiled model and its weight cache now (the runtime's teardown log kept off
        stderr: it logs every accelerator it destroys)."""
        if self.model is not None:
            with gpu_accelerator.captured_stderr():
                self.model = None
                gc.collect()
        self._cache.cleanup()

    def __del__(self) -> None:
        if getattr(self, "model", None) is not None:
            self.close()
