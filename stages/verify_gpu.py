"""DVC stages `verify_gpu_row` (one per L) and `verify_gpu_pair` (one per pair): the graph compiled for LiteRT's
GPU accelerator alone and run in fp32, fp16 and mixed (scripts/checks/gpu_check.py; each mode first shown by
its effect on the precision probe), in sections of at most verify_gpu.section_fraction of the stack's weights,
never under verify_gpu.section_min_bytes (scripts/litert/sections.py: the accelerator holds several times what
it compiles) and of verify_gpu.section_work / tokens (it waits about two minutes for a run), over the layers
verify_gpu.layers names (the first block: its residual stream against the first block in torch) ->
results/gpu/gpu_row_L{L}.json or results/gpu/gpu_pair_P{P}_S{S}.json and their metrics row. Fails, naming the
graph, on a refused op (with the signature that holds it), a partial acceleration, a non-finite output, an
fp32 error over the bound, or a mode of verify_gpu.held_to_floor over fp16_max_over_floor x the torch-float16
floor (global or per position). No Vulkan adapter, or a mode the runtime does not honour: one line."""

import argparse
import contextlib
import gc

from scripts.checkpoint import snapshot
from scripts.checks import gpu_check, model_check, tflite_check
from scripts.checks.finish import CheckResult, finish
from scripts.layers import kernel_form
from scripts.litert import sections, tflite_file
from scripts.pipeline import layout, measure, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.qwen35 import pair_graph, patch, text_stack
from scripts.qwen35.host import Host


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
        ]
    )  # layers: auto reads the source
    form = str(kernel_form.parse(p["form"]))
    bounds = gpu_check.limits(p["verify_gpu"])
    limit, over_floor = bounds["max_rel_fp32"], bounds["fp16_max_over_floor"]
    is_row = a.length is not None
    name = layout.gpu_name(a.length) if is_row else layout.gpu_name(prefix=a.prefix, suffix=a.suffix)
    path = layout.require(
        layout.row_path(a.length) if is_row else layout.pair_path(a.prefix, a.suffix),
        f"export@{a.length}" if is_row else "export_pair",
    )
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    census = tflite_file.census(path)
    found = tflite_file.violations(census)
    if found:
        raise ClefError(f"{path}: fails the census gate before the GPU: {found[0]}")
    layout.require(layout.result_path("stack"), "stack")
    if p["weights"] == "int8" and (refusal := gpu_check.int8_refusal(path, census)) is not None:
        return refused(name, path, census, p["weights"], form, refusal, a)
    config = text_stack.text_config(snap)
    layers = gpu_check.checked_layers(p["verify_gpu"]["layers"], config, p["model"]["source"])
    graph = sections.SectionedGraph(
        path,
        gpu_check.section_bytes(p["verify_gpu"], measure.stack_fp32_bytes(), a.length or max(a.prefix, a.suffix)),
        layers,
        config.hidden_size,
    )
    unreached = {sig: plan.unreached for sig, plan in graph.plans.items() if plan.unreached}
    if unreached:  # the accelerator is shown only the first block: every op kind must be in it
        sig, kinds = next(iter(unreached.items()))
        raise ClefError(
            f"{path} {sig}: op kinds only after the first block, which the GPU check would not run: {kinds}"
        )
    runs = {mode: gpu_check.ModeRun(graph, mode, census) for mode in gpu_check.MODES}
    for run in runs.values():  # no adapter: one line before any torch work (a refused op: when its section runs)
        run.gate()

    # torch first: every reference (the graph in torch, stock float64 and float16, one layer at a time);
    # then the stack is freed and each mode runs section by section, so the weights are never in memory twice
    # (with `layers`, the first block only: its residual stream where the graph's hidden would be)
    model, _, _ = patch.load(snap, form, progress=False, block=layers is not None, weights=p["weights"])
    host = Host(snap)
    stock = gpu_check.StockReferences(model)
    vocab = model.config.vocab_size
    with gpu_check.residual_stream(model, stock.twin) if layers else contextlib.nullcontext():
        if is_row:
            records = tflite_check.row_records(host, a.length, vocab, gpu_check.ROW_RECORDS)
            refs = gpu_check.row_references(model, host, stock, records)
        else:
            P, S = a.prefix, a.suffix
            shapes = pair_graph.state_shapes(model, P)
            prefixes = gpu_check.chaining_prefixes(P)
            tokens = {p: model_check.random_ids(p + S, vocab, 1000 * P + S + p) for p in prefixes}
            first = prefixes[-1]  # the signature check's prefix, also chained
            signature_refs = gpu_check.signature_references(
                pair_graph.PairPrefix(model, P).eval(),
                pair_graph.PairSuffix(model, P, S).eval(),
                host,
                P,
                S,
                tokens[first],
                first,
            )
            chaining_refs = gpu_check.chaining_references(model, host, stock, P, S, tokens)
    del model, stock
    gc.collect()

    rows = []
    for mode, run in runs.items():  # one mode at a time, one section at a time
        one = {mode: run}
        if is_row:
            rows += gpu_check.row_rows(one, refs, records)
        else:
            rows += gpu_check.pair_rows(one, host, signature_refs, chaining_refs, P, S, form, shapes)
    graph.close()
    by_mode = {mode: run.fully_accelerated for mode, run in runs.items()}
    device = runs["fp32"].device
    found, problems = gpu_check.summary(rows, bounds)
    for mode, run in runs.items():
        found["modes"][mode].update(fully_accelerated=run.fully_accelerated, probe=run.proof.as_dict())
    accelerated = all(by_mode.values())
    if not accelerated:
        problems.insert(0, "is_fully_accelerated() is false")
    doc = {
        "graph": str(path),
        "form": form,
        "weights": p["weights"],
        "kind": "row" if is_row else "pair",
        **({"L": a.length} if is_row else {"P": a.prefix, "S": a.suffix}),
        "passed": not problems,
        "problems": problems,
        "device": device,
        "fully_accelerated": accelerated,
        # the decoder layers the accelerator ran: hidden is their residual stream when not all of them
        "layers_checked": layers or config.num_hidden_layers,
        "layers": config.num_hidden_layers,
        "signatures": sorted(census["signatures"]),
        "sections": {
            sig: [{"ops": [sec.ops.start, sec.ops.stop], "constant_bytes": sec.constant_bytes} for sec in plan.sections]
            for sig, plan in graph.plans.items()
        },
        "section_limit_bytes": graph.max_bytes,
        "accelerator_seconds": {mode: round(run.seconds, 3) for mode, run in runs.items()},
        "threshold_fp32": limit,
        "threshold_per_position_fp32": bounds["max_rel_per_position_fp32"],
        **found,
        "rows": rows,
    }
    figures = dict(
        max_rel=found["fp32_max_rel_vs_torch"],
        threshold=limit,
        max_rel_per_position=found["fp32_max_rel_per_position_vs_torch"],
        threshold_per_position=bounds["max_rel_per_position_fp32"],
        fp16_max_rel=found["fp16_max_rel_vs_f64"],
        fp16_over_floor=found["fp16_over_floor"],
        mixed_over_floor=found["modes"]["mixed"]["over_floor"],
        fully_accelerated=accelerated,
        layers_checked=doc["layers_checked"],
        **({"L": a.length} if is_row else {"P": a.prefix, "S": a.suffix}),
    )
    line = (
        f"verify_gpu {path.name} on {device['adapter']}, layers {doc['layers_checked']} of {doc['layers']}: "
        f"fully accelerated {accelerated}; fp32 max rel vs torch "
        f"{found['fp32_max_rel_vs_torch']:.2e}, per position {found['fp32_max_rel_per_position_vs_torch']:.2e} "
        f"(bounds {limit:g}, {bounds['max_rel_per_position_fp32']:g}); "
        f"floor (torch float16) {found['floor_max_rel_vs_f64']:.3g}; "
        + "; ".join(
            f"{m} vs float64 {found['modes'][m]['max_rel_vs_f64']:.3g}, {found['modes'][m]['over_floor']:.2f}x the "
            f"floor ({found['modes'][m]['over_floor_per_position']:.2f}x per position)"
            for m in gpu_check.HALF_MODES
        )
        + f" (target {over_floor:g}x; held to it: {', '.join(bounds['held_to_floor']) or 'none'})"
    )
    finish(CheckResult(f"verify_gpu {path.name}", name, doc, layout.gpu_result_path(name), figures, [line], problems))


def refused(name: str, path, census: dict, weights: str, form: str, refusal: str, a) -> None:
    """An int8 graph the GPU accelerator refuses: recorded with the op it refuses, not failed (docs/release.md,
    "Weights": an int8 release runs on the CPU accelerator; fp16 storage is what a GPU takes)."""
    shape = {"L": a.length} if a.length is not None else {"P": a.prefix, "S": a.suffix}
    doc = {
        "graph": str(path),
        "form": form,
        "weights": weights,
        "kind": "row" if a.length is not None else "pair",
        **shape,
        "passed": True,
        "problems": [],
        "fully_accelerated": False,
        "refused": refusal,
        "signatures": sorted(census["signatures"]),
    }
    line = f"verify_gpu {path.name}: weights {weights}: the GPU accelerator refuses it: {refusal}"
    finish(
        CheckResult(
            f"verify_gpu {path.name}",
            name,
            doc,
            layout.gpu_result_path(name),
            dict(fully_accelerated=False, **shape),
            [line],
        )
    )


if __name__ == "__main__":
    run_stage(main)
