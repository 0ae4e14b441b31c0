"""DVC stage `export_bench`: what the form buys in the exported graph, as figures ->
results/export_bench.json. Converts the L=64 row graph of the first block under the form
(scripts/bench/conversion_bench.py) and sets it against the stock `loop` kernel's conversion
(results/export_stock.json): conversion time, per-layer op counts and interpreter latency. (LiteRT vs
torch latency of each row graph: verify_tflite.) A benchmark, never a test: these machines are noisy."""

import gc
import tempfile
from pathlib import Path

from scripts.bench import conversion_bench
from scripts.checkpoint import snapshot
from scripts.layers import kernel_form
from scripts.pipeline import atomic, layout, metrics, params
from scripts.pipeline.harness import run_stage
from scripts.qwen35.host import Host


def main() -> None:
    p = params.load(["form", "export_bench"])
    form = str(kernel_form.parse(p["form"]))
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    stock_path = layout.result_path("export_stock")
    stock_doc = layout.read_record(stock_path, "export_stock")  # the figures and the checkpoint's revision
    stock = conversion_bench.ConversionBench.from_json(stock_doc, str(stock_path))
    host = Host(snap)
    model = conversion_bench.load_block(snap, form)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "bench.tflite"
        ours = conversion_bench.convert_timed(model, form, host, scratch)
        del model
        gc.collect()  # the stack goes before the interpreter loads: the weights are never in memory twice
        ours = conversion_bench.litert_timed(ours, scratch, host)
    result = {
        "L": conversion_bench.BENCH_L,
        "form": ours.to_json(),
        "stock_loop": stock_doc,
        "convert_time_stock_over_form": stock.convert_seconds / ours.convert_seconds,
        "litert_time_stock_over_form": stock.litert_median_s / ours.litert_median_s,
        "gdn_ops_stock_over_form": stock.ops_per_gdn_layer_max / ours.ops_per_gdn_layer_max,
        "target_ops_per_gdn_layer_at_L64": p["export_bench"]["target_ops_per_gdn_layer_at_L64"],
    }
    atomic.write_json(layout.result_path("export_bench"), result)
    metrics.write(
        "export_bench",
        L=conversion_bench.BENCH_L,
        ops_per_gdn_layer=ours.ops_per_gdn_layer_max,
        gdn_ops_stock_over_form=result["gdn_ops_stock_over_form"],
        convert_time_stock_over_form=result["convert_time_stock_over_form"],
        litert_time_stock_over_form=result["litert_time_stock_over_form"],
    )
    print(
        f"export_bench L={conversion_bench.BENCH_L}: ops per GatedDeltaNet {ours.ops_per_gdn_layer_max} (form) vs "
        f"{stock.ops_per_gdn_layer_max} (loop); conversion {ours.convert_seconds:.0f} s vs "
        f"{stock.convert_seconds:.0f} s; interpreter {result['litert_time_stock_over_form']:.2f}x faster"
    )


if __name__ == "__main__":
    run_stage(main)
