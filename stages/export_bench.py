"""DVC stage `export_bench`: what the form buys in the exported graph, as figures ->
results/export_bench.json. Converts the L=64 row graph twice in one run, under the form and under
the stock `loop` kernel (constant identity, so it loads), and reports conversion time, per-layer op
counts and interpreter latency of both; then the LiteRT vs torch latency of every exported L
(artifacts/row_L{L}.tflite, medians of interleaved rounds).
A benchmark, never a test: these machines are noisy."""
import tempfile
from pathlib import Path

from scripts import atomic, clef_kernel, clef_qwen35_patch, export, model_check, params, row_graph, snapshot
from scripts import tflite_check, tflite_file
from scripts.clef_host import Host
from scripts.errors import run_stage
from scripts.measure import Stopwatch

BENCH_L = 64


def convert_timed(snap, form: str, host: Host) -> dict:
    model, _, _ = clef_qwen35_patch.load(snap, form, progress=False)
    graph = row_graph.ClefRowPrefill(model, BENCH_L)
    inputs = host.record(model_check.random_ids(BENCH_L, model.config.vocab_size, BENCH_L), BENCH_L)
    clock = Stopwatch()
    content = export.convert(graph, inputs)
    seconds = clock.seconds()
    census = tflite_file.census(content)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.tflite"
        path.write_bytes(content)
        runner = tflite_check.interpreter(path).get_signature_runner()
        timing = tflite_check.latency(runner, graph, inputs, repeats=5)
    per_layer = list(census["ops_per_gdn_layer"].values())
    return {"form": form, "convert_seconds": seconds, "op_total": census["op_total"],
            "ops_per_gdn_layer_max": max(per_layer), "ops_per_gdn_layer_min": min(per_layer),
            "violations": tflite_file.violations(census), "litert_median_s": timing["litert_median_s"]}


def main() -> None:
    p = params.load(["form", "lengths"])
    form = str(clef_kernel.parse(p["form"]))
    lengths = params.check_lengths(p["lengths"])
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    host = Host(snap)
    ours = convert_timed(snap, form, host)
    stock = convert_timed(snap, "loop", host)
    model, _, _ = clef_qwen35_patch.load(snap, form, progress=False)
    per_l = {}
    for n in lengths:
        path = Path(f"artifacts/row_L{n}.tflite")
        census = tflite_file.census(path.read_bytes())
        runner = tflite_check.interpreter(path).get_signature_runner()
        timing = tflite_check.latency(runner, row_graph.ClefRowPrefill(model, n).eval(),
                                      host.record(model_check.random_ids(n, model.config.vocab_size, n), n),
                                      repeats=7)
        per_l[str(n)] = {**timing, "ops_per_gdn_layer_max": max(census["ops_per_gdn_layer"].values()),
                         "op_total": census["op_total"]}
    result = {"L": BENCH_L, "form": ours, "stock_loop": stock,
              "convert_time_stock_over_form": stock["convert_seconds"] / ours["convert_seconds"],
              "litert_time_stock_over_form": stock["litert_median_s"] / ours["litert_median_s"],
              "gdn_ops_stock_over_form": stock["ops_per_gdn_layer_max"] / ours["ops_per_gdn_layer_max"],
              "target_ops_per_gdn_layer_at_L64": 150, "per_L": per_l}
    atomic.write_json("results/export_bench.json", result)
    print(f"export_bench L={BENCH_L}: ops per GatedDeltaNet {ours['ops_per_gdn_layer_max']} (form) vs "
          f"{stock['ops_per_gdn_layer_max']} (loop); conversion {ours['convert_seconds']:.0f} s vs "
          f"{stock['convert_seconds']:.0f} s; interpreter {result['litert_time_stock_over_form']:.2f}x faster")


if __name__ == "__main__":
    run_stage(main)
