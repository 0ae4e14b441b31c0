"""results/bundle_memory.json: does a device hold one copy of the weights with every signature of a bundle
compiled? Measured where the weights dominate, unlike the tiny checkpoint's graphs (7 MB of weights
beside each signature's own buffers): one MLP of WEIGHT_MIB of fp32 weights converted at LENGTHS tokens,
each graph its own file, then the three bundled (scripts/litert/bundle.py). Each file is compiled in a
fresh process with every signature run once (scripts/checks/bundle_check.memory), on the CPU accelerator
and on the GPU accelerator in fp32 and fp16; the figure is the bundle's memory over one graph's, for the
memory held and the peak. Beside it, what three separate graphs would hold: three times one graph's.
A benchmark: `make bundle-memory`, not part of `make test`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from scripts.checks import bundle_check
from scripts.litert import bundle, export
from scripts.pipeline import atomic, layout
from scripts.pipeline.harness import run_stage

HIDDEN, INNER = 2048, 4096  # two Linear layers without bias: 2 x 32 MiB of fp32 weights
WEIGHT_MIB = 2 * HIDDEN * INNER * 4 / 2**20
LENGTHS = (16, 32, 64)
OUT = layout.RESULTS / "bundle_memory.json"


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, INNER, bias=False)
        self.down = torch.nn.Linear(INNER, HIDDEN, bias=False)

    def forward(self, x):
        return {"y": self.down(torch.relu(self.up(x)))}


def main() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    with tempfile.TemporaryDirectory() as tmp:
        parts = []
        for n in LENGTHS:
            path = Path(tmp) / f"mlp_L{n}.tflite"
            export.convert(model, {"x": torch.randn(1, n, HIDDEN)}, path)
            parts.append(bundle.Part(path, {"serving_default": f"L{n}"}))
        merged = bundle.merge(parts, Path(tmp) / "bundle.tflite", {"kind": "bundle"})
        largest = parts[-1].path
        figures = {}
        for accelerator, mode in (("cpu", "fp32"), ("gpu", "fp32"), ("gpu", "fp16")):
            found = bundle_check.memory_against(Path(tmp) / "bundle.tflite", largest, accelerator, mode)
            figures[f"{accelerator} {mode}"] = {**found.to_json(), "three_graphs_over_graph": 3.0}
            every, one = found.bundle, found.largest_graph
            print(
                f"bundle_memory: {accelerator} {mode}: held {every.held / 2**20:.0f} MiB with the bundle's "
                f"{len(LENGTHS)} signatures vs {one.held / 2**20:.0f} MiB for one graph "
                f"({figures[f'{accelerator} {mode}']['held_over_graph']:.2f}x)",
                flush=True,
            )
    atomic.write_json(
        OUT,
        {
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "weights_mib": WEIGHT_MIB,
            "lengths": list(LENGTHS),
            "bundle": merged.to_json(),
            "memory": figures,
        },
    )
    print(f"bundle_memory: -> {OUT}")


if __name__ == "__main__":
    run_stage(main, budget=False)
