"""Verification of a bundle against the files it was made from, and the memory it holds compiled.

- identity: every graph's reference record (results/references/) through its signatures in the bundle
  and in its own file, on LiteRT's CPU accelerator and, compiled for the GPU accelerator alone, in each
  GPU mode; every output of every signature compared. The bundle's subgraphs are the files' subgraphs
  over the same constant bytes, so the outputs must be bit-identical, and the check holds them to that
  (its figure, max |bundle - file| / max |file| over every output, must be 0);
- memory: the graph compiled with every signature run once, in a process of its own, against the
  largest single graph compiled the same way: what the process holds (anonymous, mapped-file and
  shared pages; on a machine without a GPU the software GPU's "device" memory is shared pages) over
  what it held before the compile, after the runtime was loaded.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import torch

from scripts.checks import compare
from scripts.pipeline import layout
from scripts.pipeline.mappings import Tensors
from scripts.pipeline.records import Record, optional
from scripts.release import references


@dataclasses.dataclass(frozen=True)
class Graph:
    """One graph the bundle holds: its own file, and its signatures' names there and in the bundle."""

    name: str  # row_L64, pair_P256_S64
    kind: str
    shape: dict
    path: Path
    signatures: dict[str, str]  # name in its own file -> name in the bundle


def planned(lengths: list[int], pairs: list[dict]) -> list[Graph]:
    """The graphs params.yaml asks for, in the order the bundle holds them (rows by L, then pairs)."""
    out = []
    for n in lengths:
        shape = {"L": n}
        out.append(Graph(layout.row_name(n), "row", shape, layout.row_path(n), layout.bundle_signatures("row", shape)))
    for q in pairs:
        shape = {"P": q["prefix"], "S": q["suffix"]}
        path = layout.pair_path(q["prefix"], q["suffix"])
        out.append(Graph(path.stem, "pair", shape, path, layout.bundle_signatures("pair", shape)))
    return out


def run_record(signature, kind: str, record: dict) -> tuple[dict, dict]:
    """The reference record through `signature` (references.reference_error's) -> its figures, and
    every output of every signature it ran, as {"<signature>.<output>": tensor}."""
    outputs = {}

    def capturing(name):
        call = signature(name)

        def run(**feeds):
            out = call(**feeds)
            outputs.update({f"{name or 'row'}.{k}": v.clone() for k, v in out.items()})
            return out

        return run

    return references.reference_error(capturing, kind, record).to_json(), outputs


@dataclasses.dataclass(frozen=True)
class OutputDifference(Record):
    """One graph's outputs through the bundle against its own file's: whether every one is bit-identical,
    the largest relative difference, how many outputs, and why they cannot be compared where they cannot."""

    identical: bool
    max_rel: float | None
    outputs: int
    why: str | None = optional()


def difference(bundle: Tensors, file: Tensors) -> OutputDifference:
    """The bundle's outputs against the file's (compare.rel: inf when the bundle's is not finite, NaN when
    the file's is not)."""
    if bundle.keys() != file.keys():
        return OutputDifference(identical=False, max_rel=float("inf"), outputs=len(file), why="different outputs")
    rels = [compare.rel(bundle[k], file[k]) for k in file]
    same = all(torch.equal(bundle[k], file[k]) for k in file)
    return OutputDifference(identical=same, max_rel=compare.largest(rels), outputs=len(file))


# ---- memory, in a process of its own -------------------------------------------------------------


def held_bytes() -> int:
    from scripts.pipeline.measure import memory_status

    status = memory_status()
    return status.anon + status.file  # anon includes shared pages (memory_status)


def _memory_main(accelerator: str, mode: str, path: str) -> None:
    """Compile `path`, run each signature once on zeros, print what the process held: before the compile
    (the runtime loaded), after it, and at its peak (VmHWM), in bytes, as one JSON line."""
    import numpy as np

    from scripts.litert import gpu_accelerator, litert_c
    from scripts.litert.cpu_graph import CpuGraph
    from scripts.pipeline.measure import memory_status

    shapes = litert_c.signature_shapes(path)
    with gpu_accelerator.captured_stderr():
        litert_c.library()
    before = held_bytes()
    if accelerator == "cpu":
        graph = CpuGraph(path, dynamic_kernels=True)  # as stored: what a device's CPU holds
        runner = graph.get_signature_runner
    else:
        graph = gpu_accelerator.compile(path, mode)
        model = graph.model
        runner = lambda name: gpu_accelerator.signature_runner(model, path, name, quiet_runs=True)  # noqa: E731
    compiled = held_bytes()
    for name, io in shapes.items():
        runner(name)(**{k: np.zeros(s, np.float32) for k, s in io["inputs"].items()})
    print(json.dumps({"before": before, "compiled": compiled, "held": held_bytes(), "peak": memory_status().peak}))


@dataclasses.dataclass(frozen=True)
class HeldBytes(Record):
    """What compiling a graph and running each signature once held, in bytes over what the process held
    before the compile: after the compile, after the runs, and at its peak."""

    compiled: int
    held: int
    peak: int


@dataclasses.dataclass(frozen=True)
class MemoryAgainst(Record):
    """A bundle's HeldBytes against one of its graphs', and the bundle's held and peak bytes over the graph's."""

    bundle: HeldBytes
    largest_graph: HeldBytes
    held_over_graph: float
    peak_over_graph: float


def memory(path: Path, accelerator: str, mode: str = "fp32") -> HeldBytes:
    """What compiling `path` and running each signature once holds, measured in a fresh process."""
    from scripts.pipeline.errors import ClefError

    proc = subprocess.run(
        [sys.executable, "-m", "scripts.checks.bundle_check", accelerator, mode, str(path)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.strip().splitlines()[-1:])
        raise ClefError(f"{path}: the memory probe on the {accelerator} failed (exit {proc.returncode}): {tail}")
    doc = json.loads(lines[-1])
    return HeldBytes(**{k: doc[k] - doc["before"] for k in ("compiled", "held", "peak")})


def memory_against(path: Path, graph: Path, accelerator: str, mode: str = "fp32") -> MemoryAgainst:
    """`memory` of `path` (a bundle) against that of `graph` (one of its graphs), each in a process of its
    own."""
    one, every = memory(graph, accelerator, mode), memory(path, accelerator, mode)
    return MemoryAgainst(every, one, every.held / max(one.held, 1), every.peak / max(one.peak, 1))


if __name__ == "__main__":
    _memory_main(*sys.argv[1:4])
