"""DVC stage `export_bench`: what the form buys in the exported graph, as figures ->
results/export_bench.json. Converts the L=64 row graph under the form and sets it against the stock
`loop` kernel's conversion (results/export_stock.json): conversion time, per-layer op counts and
interpreter latency; then the LiteRT vs torch latency of every exported L (artifacts/rows/, medians;
torch for every graph first, then the stack is freed and each interpreter loads in turn). A
benchmark, never a test: these machines are noisy."""

import gc
import tempfile
from pathlib import Path

from scripts.bench import conversion_bench
from scripts.checkpoint import snapshot
from scripts.checks import model_check, tflite_check
from scripts.layers import kernel_form
from scripts.litert import tflite_file
from scripts.pipeline import atomic, layout, metrics, params
from scripts.pipeline.errors import run_stage
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host


def main() -> None:
    p = params.load(["form", "lengths", "export_bench"])
    form = str(kernel_form.parse(p["form"]))
    lengths = p["lengths"]
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    stock = layout.read_record(layout.result_path("export_stock"), "export_stock")
    host = Host(snap)
    repeats = p["export_bench"]["latency_repeats"]
    model, _, _ = patch.load(snap, form, progress=False)
    records = {n: host.record(model_check.random_ids(n, model.config.vocab_size, n), n) for n in lengths}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "bench.tflite"
        ours = conversion_bench.convert_timed(model, form, host, scratch)
        torch_s = {
            n: tflite_check.torch_seconds(row_graph.ClefRowPrefill(model, n).eval(), records[n], repeats)
            for n in lengths
        }
        del model
        gc.collect()  # torch first, then the interpreters, one at a time: the weights are never in memory twice
        ours = conversion_bench.litert_timed(ours, scratch, host)
    per_l = {}
    for n in lengths:
        path = layout.row_path(n)
        census = tflite_file.census(layout.require(path, f"export@{n}"))
        runner = tflite_check.interpreter(path).get_signature_runner()
        litert_s = tflite_check.litert_seconds(runner, records[n], repeats)
        del runner
        gc.collect()
        per_l[str(n)] = {
            **tflite_check.latency(litert_s, torch_s[n], repeats),
            "ops_per_gdn_layer_max": max(census["ops_per_gdn_layer"].values()),
            "op_total": census["op_total"],
        }
    result = {
        "L": conversion_bench.BENCH_L,
        "form": ours,
        "stock_loop": stock,
        "convert_time_stock_over_form": stock["convert_seconds"] / ours["convert_seconds"],
        "litert_time_stock_over_form": stock["litert_median_s"] / ours["litert_median_s"],
        "gdn_ops_stock_over_form": stock["ops_per_gdn_layer_max"] / ours["ops_per_gdn_layer_max"],
        "target_ops_per_gdn_layer_at_L64": p["export_bench"]["target_ops_per_gdn_layer_at_L64"],
        "per_L": per_l,
    }
    atomic.write_json(layout.result_path("export_bench"), result)
    metrics.write(
        "export_bench",
        L=conversion_bench.BENCH_L,
        ops_per_gdn_layer=ours["ops_per_gdn_layer_max"],
        gdn_ops_stock_over_form=result["gdn_ops_stock_over_form"],
        convert_time_stock_over_form=result["convert_time_stock_over_form"],
        litert_time_stock_over_form=result["litert_time_stock_over_form"],
    )
    print(
        f"export_bench L={conversion_bench.BENCH_L}: ops per GatedDeltaNet {ours['ops_per_gdn_layer_max']} (form) vs "
        f"{stock['ops_per_gdn_layer_max']} (loop); conversion {ours['convert_seconds']:.0f} s vs "
        f"{stock['convert_seconds']:.0f} s; interpreter {result['litert_time_stock_over_form']:.2f}x faster"
    )


if __name__ == "__main__":
    run_stage(main)
