"""DVC stage `export` (one per L): the row graph of the patched fp32 stack under the form, converted
with litert_torch -> artifacts/rows/row_L{L}.tflite, with provenance metadata inside."""

import argparse

from scripts.checkpoint import snapshot
from scripts.layers import kernel_form
from scripts.litert import export
from scripts.pipeline import atomic, layout, metrics, params
from scripts.pipeline.harness import run_stage
from scripts.pipeline.measure import Stopwatch, peak_rss_bytes
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, required=True)
    length = ap.parse_args().length
    p = params.load(["form", "weights"])
    form = kernel_form.parse(p["form"])
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    export.check_exportable(form, length, snapshot.max_positions(path))

    clock = Stopwatch()
    model, info, _ = patch.load(path, str(form), weights=p["weights"])
    contract = row_graph.contract(model.config, length, str(form))
    out = layout.row_path(length)
    meta = export.metadata(
        rec,
        str(form),
        p["weights"],
        contract,
        {"kind": "row", "L": length},
        {"form": p["form"], "weights": p["weights"], "length": length},
    )
    with atomic.scratch_file(out, ".raw") as raw:
        export.convert_row(model, Host(path), length, raw)
        size = export.write(out, raw, meta.to_json(), info["weights"])
    doc = {
        "L": length,
        "form": str(form),
        "weights": p["weights"],
        "bytes": size,
        "seconds": clock.seconds(),
        "peak_rss_bytes": peak_rss_bytes(),
    }
    atomic.write_json(layout.result_path(f"export_L{length}"), doc)
    metrics.write(
        f"export_L{length}", L=length, bytes=size, seconds=doc["seconds"], peak_rss_mb=doc["peak_rss_bytes"] / 2**20
    )
    print(f"export: {out} ({size / 2**20:.1f} MiB) in {clock.seconds():.0f} s")


if __name__ == "__main__":
    run_stage(main)
