"""DVC stage `verify_tflite` (one per L): artifacts/rows/row_L{L}.tflite in the LiteRT interpreter vs the
torch row graph, its op census read from the file, its metadata, and latency ->
results/tflite_L{L}.json. Fails, naming the problem, on an error over a bound (global or per position),
a census violation (rank > 4, custom / STABLEHLO / WHILE / CUMSUM / GATHER_ND ops, int64 tensors), or
when the memory-cut control (the torch graph with the fault, against the file) does not break the
global bound by controls.min_over_threshold."""

import argparse
import gc

from scripts.checkpoint import snapshot
from scripts.checks import compare, model_check, quantization_effect, tflite_check
from scripts.checks.finish import CheckResult, finish
from scripts.layers import kernel_form, weight_precision
from scripts.litert import tflite_file
from scripts.pipeline import layout, params
from scripts.pipeline.harness import run_stage
from scripts.pipeline.progress import Phases
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host
from scripts.release import references


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, required=True)
    length = ap.parse_args().length
    p = params.load(["form", "weights", "verify_tflite.latency_repeats", "verify_tflite.latency_seconds"])
    form = str(kernel_form.parse(p["form"]))
    limits = params.bounds(p, "verify_tflite", ("rel_vs_torch", "rel_per_position_vs_torch"))
    limit = limits["rel_vs_torch"]
    min_over = params.min_over_threshold(p)
    path = layout.row_path(length)
    layout.require(path, "export")
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    census = tflite_file.census(path)
    meta = tflite_file.read_metadata(path)
    problems = [f"census: {v}" for v in tflite_file.violations(census)]
    expected = {
        "repo": rec["repo"],
        "revision": rec["revision"],
        "form": form,
        "weights": p["weights"],
        "kind": "row",
        "L": length,
        "contract_version": row_graph.CONTRACT_VERSION,
    }
    problems += [f"metadata: {m}" for m in tflite_file.metadata_mismatches(meta, expected)]

    # torch first: the unquantized truth, then (the weights stored at `weights`) the references, the
    # controls' outputs and torch's latency; then the stack is freed and the interpreter loads, so the
    # weights are never in memory twice (params.yaml `memory`)
    phases = (
        "load the stack",
        "torch references",
        "torch timing",
        "interpreter",
        "LiteRT records",
        "reference record",
        "LiteRT timing",
    )
    with Phases(f"verify_tflite L={length}", phases) as phase:
        phase("load the stack")
        model, _, _ = patch.load(snap, form)
        host = Host(snap)
        vocab = model.config.vocab_size
        records = tflite_check.row_records(host, length, vocab)
        phase("torch references")
        truths = quantization_effect.truths(model, records)
        applied = weight_precision.apply(model, p["weights"])
        graph = row_graph.ClefRowPrefill(model, length).eval()
        expected = {kind: tflite_check.torch_reference(graph, inputs, n, form) for kind, (n, inputs) in records.items()}
        # the release packages the padded record (two thirds of L real); `clef verify` reruns it wherever it lands
        padded = records[tflite_check.REFERENCE_KIND][1]
        references.save(
            references.row_reference(padded, expected[tflite_check.REFERENCE_KIND]["hidden"]),
            layout.reference_path(path),
        )
        phase("torch timing")
        timed = host.record(model_check.random_ids(length, vocab, length), length)
        repeats, budget = int(p["verify_tflite"]["latency_repeats"]), float(p["verify_tflite"]["latency_seconds"])
        torch_runs = tflite_check.torch_times(graph, timed, repeats, budget)
        del graph, model
        gc.collect()

        phase("interpreter")
        interp = tflite_check.interpreter(path)
        runner = interp.get_signature_runner()
        phase("LiteRT records")
        outputs = {kind: tflite_check.run(runner, inputs) for kind, (_, inputs) in records.items()}
        rows = [tflite_check.record_row(kind, n, outputs[kind], expected[kind]) for kind, (n, _) in records.items()]
        effect = [
            quantization_effect.row(kind, n, outputs[kind][0, :n], truths[kind], host)
            for kind, (n, _) in records.items()
        ]
        problems += [f"accuracy: {line}" for line in compare.judge(rows, limits)]
        control = compare.worst(rows, "control_memory_cut_rel_vs_torch")
        problems += compare.control_problems("memory_cut", control, limit, min_over)
        # the saved record read back through this graph: the figures the release states for it
        phase("reference record")
        reference = references.measure(path, "row", interp)
        phase("LiteRT timing")
        timing = tflite_check.latency(
            tflite_check.litert_times(runner, timed, repeats, budget), torch_runs, repeats, budget
        )
    doc = {
        "L": length,
        "form": form,
        "file": str(path),
        "bytes": path.stat().st_size,
        "thresholds": limits,
        "passed": not problems,
        "problems": problems,
        "rows": rows,
        "max_rel_vs_torch": compare.worst(rows, "rel_vs_torch"),
        "max_rel_per_position_vs_torch": compare.worst(rows, "rel_per_position_vs_torch"),
        "weights": applied.as_dict(),
        "quantization_effect": {**quantization_effect.summary(effect), "rows": effect},
        "control_memory_cut": {
            "rel_vs_torch": control,
            "over_threshold": compare.margin(control, limit),
            "required_over_threshold": min_over,
            "applies": control is not None,
            "what": "the torch graph with the state zeroed at each chunk boundary, against the "
            "file (none where no record spans two chunks)",
        },
        "census": census,
        "metadata": meta,
        "reference_record": reference,
        "latency": timing,
    }
    gdn_ops = sorted(set(census["ops_per_gdn_layer"].values()))
    figures = dict(
        max_rel=doc["max_rel_vs_torch"],
        threshold=limit,
        max_rel_per_position=doc["max_rel_per_position_vs_torch"],
        threshold_per_position=limits["rel_per_position_vs_torch"],
        control_over_threshold=doc["control_memory_cut"]["over_threshold"],
        L=length,
        bytes=path.stat().st_size,
        op_total=census["op_total"],
        max_rank=census["max_rank"],
        ops_per_gdn_layer=max(gdn_ops) if gdn_ops else None,
        torch_over_litert=timing["torch_over_litert"],
        litert_ms=1e3 * timing["litert_median_s"],
    )
    line = (
        f"verify_tflite L={length}: max rel vs torch {doc['max_rel_vs_torch']:.2e}, per position "
        f"{doc['max_rel_per_position_vs_torch']:.2e} (bounds {limit:g}, {limits['rel_per_position_vs_torch']:g}); "
        f"memory-cut control {compare.shown(control)}; "
        f"{census['op_total']} ops, {gdn_ops} per GatedDeltaNet, max rank {census['max_rank']}; "
        f"torch/litert time {timing['torch_over_litert']:.2f}x; weights {p['weights']}: top-1 agreement with "
        f"the unquantized model {doc['quantization_effect']['min_top1_agreement']:.3f}"
    )
    name = f"tflite_L{length}"
    finish(CheckResult(f"verify_tflite L={length}", name, doc, layout.result_path(name), figures, [line], problems))


if __name__ == "__main__":
    run_stage(main)
