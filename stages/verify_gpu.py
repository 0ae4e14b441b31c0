"""DVC stages `verify_gpu_row` (one per L) and `verify_gpu_pair` (one per pair): the graph on LiteRT's GPU
accelerator alone, in fp32, fp16 and mixed, in sections, over the layers verify_gpu.layers names
(scripts/checks/gpu_verification.py) -> results/gpu/gpu_row_L{L}.json or results/gpu/gpu_pair_P{P}_S{S}.json
and their metrics row. Fails, naming the graph, on a census violation, a refused op, a partial
acceleration, a non-finite output, or an error over its bound. No Vulkan adapter, or a mode the runtime
does not honour: one line."""

import argparse

from scripts.checkpoint import snapshot
from scripts.checks import gpu_check, gpu_verification
from scripts.checks.finish import finish
from scripts.layers import kernel_form
from scripts.litert import sections, tflite_file
from scripts.pipeline import layout, measure, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.qwen35 import text_stack


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int)
    ap.add_argument("--prefix", type=int)
    ap.add_argument("--suffix", type=int)
    a = ap.parse_args()
    if (a.length is None) == (a.prefix is None or a.suffix is None):
        raise ClefError("verify_gpu takes --length L (a row graph) or --prefix P --suffix S (a pair)")
    p = params.load(
        [
            "form",
            "weights",
            "verify_gpu.section_fraction",
            "verify_gpu.section_min_bytes",
            "verify_gpu.section_work",
            "verify_gpu.layers",
            "model.source",
            "decision.scored_tokens",
            "decision.pair_scored_tokens",
        ]
    )  # layers: auto reads the source
    form = str(kernel_form.parse(p["form"]))
    bounds = gpu_check.limits(p["verify_gpu"])
    of = gpu_verification.GraphShape(a.length, a.prefix, a.suffix)
    path = of.require()
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    census = tflite_file.census(path)
    found = tflite_file.violations(census)
    if found:
        raise ClefError(f"{path}: fails the census gate before the GPU: {found[0]}")
    layout.require(layout.result_path("stack"), "stack")
    config = text_stack.text_config(snap)
    layers = gpu_check.checked_layers(p["verify_gpu"]["layers"], config, p["model"]["source"])
    limit = gpu_check.section_bytes(p["verify_gpu"], measure.stack_fp32_bytes(), of.tokens)
    graph = sections.SectionedGraph(path, limit, layers, config.hidden_size)
    gpu_verification.require_first_block_reaches_all(graph, path)
    runs = {mode: gpu_check.ModeRun(graph, mode, census) for mode in gpu_check.MODES}
    for run in runs.values():  # no adapter: one line before any torch work (a refused op: when its section runs)
        run.gate()
    rows, made = gpu_verification.rows(of, snap, form, p["weights"], layers, runs, rec.source, p["decision"])
    graph.close()
    depth = layers or config.num_hidden_layers
    found = gpu_verification.GpuFindings(
        of, path, form, p["weights"], census, depth, config.num_hidden_layers, graph, runs, rows, made
    )
    finish(gpu_verification.result(found, bounds))


if __name__ == "__main__":
    run_stage(main)
