"""DVC stage `export_pair` (one per pair): artifacts/pairs/pair_P{P}_S{S}.tflite with two signatures,
`prefix` and `suffix`, over one copy of the weights, with provenance metadata inside."""

from scripts.checkpoint import snapshot
from scripts.layers import kernel_form
from scripts.litert import export
from scripts.pipeline import atomic, cli, layout, metrics, params
from scripts.pipeline.harness import run_stage
from scripts.pipeline.measure import Stopwatch, peak_rss_bytes
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host


def main() -> None:
    a = cli.pair_arguments()
    p = params.load(["form", "weights"])
    form = kernel_form.parse(p["form"])
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    max_positions = snapshot.max_positions(path)
    for n in (a.prefix, a.suffix):
        export.check_exportable(form, n, max_positions)
    params.within_context(f"P + S = {a.prefix + a.suffix}", a.prefix + a.suffix, max_positions)

    clock = Stopwatch()
    model, info, _ = patch.load(path, str(form), weights=p["weights"])
    host = Host(path)
    contract = pair_graph.contract(model, a.prefix, a.suffix, str(form))
    out = layout.pair_path(a.prefix, a.suffix)
    meta = export.metadata(
        rec,
        str(form),
        p["weights"],
        contract,
        {"kind": "pair", "P": a.prefix, "S": a.suffix},
        {"form": p["form"], "weights": p["weights"], "prefix": a.prefix, "suffix": a.suffix},
    )
    with atomic.scratch_file(out, ".raw") as raw:
        export.convert_pair(model, host, a.prefix, a.suffix, raw)
        size = export.write(out, raw, meta.to_json(), info["weights"])
    name = f"export_{layout.pair_name(a.prefix, a.suffix)}"
    doc = {
        "P": a.prefix,
        "S": a.suffix,
        "form": str(form),
        "weights": p["weights"],
        "bytes": size,
        "seconds": clock.seconds(),
        "peak_rss_bytes": peak_rss_bytes(),
    }
    atomic.write_json(layout.result_path(name), doc)
    metrics.write(
        name, P=a.prefix, S=a.suffix, bytes=size, seconds=doc["seconds"], peak_rss_mb=doc["peak_rss_bytes"] / 2**20
    )
    print(f"export_pair: {out} ({size / 2**20:.1f} MiB) in {clock.seconds():.0f} s")


if __name__ == "__main__":
    run_stage(main)
