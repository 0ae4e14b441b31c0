"""DVC stage `export_stock`: the L=64 row graph of the first block converted with the stock `loop` kernel (transformers'
algorithm op for op, constant identity so it loads) -> results/export_stock.json: the baseline the
form is measured against in export_bench. It reads no form, so trying a new form does not redo it."""

import gc
import tempfile
from pathlib import Path

from scripts.bench import conversion_bench
from scripts.checkpoint import snapshot
from scripts.pipeline import atomic, layout
from scripts.pipeline.harness import run_stage
from scripts.qwen35.host import Host


def main() -> None:
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    host = Host(snap)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stock.tflite"
        model = conversion_bench.load_block(snap, "loop")
        doc = conversion_bench.convert_timed(model, "loop", host, path)
        del model
        gc.collect()  # the stack goes before the interpreter loads
        doc = conversion_bench.litert_timed(doc, path, host)
    atomic.write_json(layout.result_path("export_stock"), {"revision": rec.revision, **doc.to_json()})
    print(
        f"export_stock L={doc.L}: {doc.ops_per_gdn_layer_max} ops per GatedDeltaNet, "
        f"conversion {doc.convert_seconds:.0f} s"
    )


if __name__ == "__main__":
    run_stage(main)
