"""results/bundle_memory.json: does a device hold one copy of the weights with every signature of a bundle
compiled? Measured where the weights dominate, unlike the tiny checkpoint's graphs (7 MB of weights
beside each signature's own buffers): one MLP of WEIGHT_MIB of fp32 weights converted at LENGTHS tokens,
each graph its own file, then the three bundled (scripts/litert/bundle.py), once for each of WEIGHTS as
the pipeline stores them (the MLP's weights quantized in torch first: scripts/layers/weight_precision.py).
Each file is compiled in a fresh process with every signature run once (scripts/checks/bundle_check.memory),
on the CPU accelerator and on the GPU accelerator in fp32 and fp16; the figures are the bundle's memory over
one graph's, for the memory held and the peak, and each precision's bundle memory over the fp16 bundle's
in the same place: whether the accelerator keeps integer weights packed. Beside it, what three separate
graphs would hold: three times one graph's. A benchmark: `make bundle-memory`, not part of `make test`.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import torch

from scripts.checks import bundle_check
from scripts.layers import weight_precision
from scripts.litert import bundle, export, weight_storage
from scripts.pipeline import atomic, layout
from scripts.pipeline.harness import run_stage

HIDDEN, INNER = 2048, 4096  # two Linear layers without bias: 2 x 32 MiB of fp32 weights
WEIGHT_MIB = 2 * HIDDEN * INNER * 4 / 2**20
LENGTHS = (16, 32, 64)
WEIGHTS = ("fp32", "fp16", "int8", "int4")
PLACES = (("cpu", "fp32"), ("gpu", "fp32"), ("gpu", "fp16"))
OUT = layout.RESULTS / "bundle_memory.json"


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, INNER, bias=False)
        self.down = torch.nn.Linear(INNER, HIDDEN, bias=False)

    def forward(self, x):
        return {"y": self.down(torch.relu(self.up(x)))}


def bundled(model: Mlp, weights: str, tmp: Path) -> tuple[Path, Path, bundle.Merged]:
    """The MLP at `weights`, one graph per length stored as the pipeline stores it, and their bundle ->
    (the bundle, its largest graph, the merge's record)."""
    stored = copy.deepcopy(model)
    weight_precision.apply(stored, weights)
    parts = []
    for n in LENGTHS:
        raw, path = tmp / f"mlp_{weights}_L{n}.raw", tmp / f"mlp_{weights}_L{n}.tflite"
        export.convert(stored, {"x": torch.randn(1, n, HIDDEN)}, raw)
        weight_storage.store(raw, path, weights)
        raw.unlink()
        parts.append(bundle.Part(path, {"serving_default": f"L{n}"}))
    out = tmp / f"bundle_{weights}.tflite"
    return out, parts[-1].path, bundle.merge(parts, out, {"kind": "bundle"})


def held_per_stored_byte(figures: dict, base: dict) -> dict[str, dict[str, float]] | None:
    """What each byte the file stores less than fp16's saves in memory held, per place, for one graph and
    the bundle: 1 where the accelerator holds the weights as stored (packed), 0 where it widens them back
    to fp16, below 0 to float32. On this MLP the runtime's own buffers (shaders, each signature's tensors)
    are most of what is held; the weights' share is what this isolates. None for fp16 itself."""
    saved = {
        "largest_graph": base["graph_bytes"] - figures["graph_bytes"],
        "bundle": base["bundle_bytes"] - figures["bundle_bytes"],
    }
    if not all(saved.values()):
        return None
    return {
        place: {
            part: (base["memory"][place][part]["held"] - m[part]["held"]) / saved[part]
            for part in ("largest_graph", "bundle")
        }
        for place, m in figures["memory"].items()
    }


def main() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    by_weights = {}
    with tempfile.TemporaryDirectory() as tmp:
        for weights in WEIGHTS:
            path, largest, merged = bundled(model, weights, Path(tmp))
            figures = {
                "bundle": merged.to_json(),
                "bundle_bytes": path.stat().st_size,
                "graph_bytes": largest.stat().st_size,
                "memory": {},
            }
            for accelerator, mode in PLACES:
                found = bundle_check.memory_against(path, largest, accelerator, mode)
                place = f"{accelerator} {mode}"
                figures["memory"][place] = {**found.to_json(), "three_graphs_over_graph": 3.0}
                every, one = found.bundle, found.largest_graph
                print(
                    f"bundle_memory {weights}: {place}: held {every.held / 2**20:.0f} MiB with the bundle's "
                    f"{len(LENGTHS)} signatures vs {one.held / 2**20:.0f} MiB for one graph "
                    f"({figures['memory'][place]['held_over_graph']:.2f}x)",
                    flush=True,
                )
            by_weights[weights] = figures
    base = by_weights["fp16"]
    for figures in by_weights.values():
        figures["bundle_held_over_fp16"] = {
            place: m["bundle"]["held"] / max(base["memory"][place]["bundle"]["held"], 1)
            for place, m in figures["memory"].items()
        }
        figures["held_per_stored_byte"] = held_per_stored_byte(figures, base)
    atomic.write_json(
        OUT,
        {
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "weights_mib": WEIGHT_MIB,
            "lengths": list(LENGTHS),
            "weights": by_weights,
        },
    )
    print(
        "bundle_memory: bundle held over fp16's: "
        + "; ".join(
            f"{w} " + ", ".join(f"{p} {r:.2f}x" for p, r in f["bundle_held_over_fp16"].items())
            for w, f in by_weights.items()
        )
        + f" -> {OUT}"
    )


if __name__ == "__main__":
    run_stage(main, budget=False)
