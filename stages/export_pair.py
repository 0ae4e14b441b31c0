"""DVC stage `export_pair` (one per pair): artifacts/pair_P{P}_S{S}.tflite with two signatures,
`prefix` and `suffix`, over one copy of the weights, with provenance metadata inside."""
import argparse
import json
from pathlib import Path

import torch

from scripts import atomic, clef_kernel, clef_qwen35_patch, export, pair_graph, params, snapshot
from scripts.clef_host import Host
from scripts.errors import ClefError, run_stage
from scripts.measure import Stopwatch, peak_rss_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, required=True)
    ap.add_argument("--suffix", type=int, required=True)
    a = ap.parse_args()
    p = params.load(["form"])
    form = clef_kernel.parse(p["form"])
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    text = json.loads((path / "config.json").read_text())["text_config"]
    for n in (a.prefix, a.suffix):
        export.check_exportable(form, n, text["max_position_embeddings"])
    if a.prefix + a.suffix > text["max_position_embeddings"]:
        raise ClefError(f"P + S = {a.prefix + a.suffix} is above max_position_embeddings ({text['max_position_embeddings']})")

    clock = Stopwatch()
    model, _, _ = clef_qwen35_patch.load(path, str(form))
    host = Host(path)
    prefix = pair_graph.PairPrefix(model, a.prefix).eval()
    suffix = pair_graph.PairSuffix(model, a.prefix, a.suffix).eval()
    first = host.record([0], a.prefix)
    with torch.no_grad():
        state = {k: v for k, v in prefix(**first).items() if k != "hidden"}
    content = export.convert_signatures({"prefix": (prefix, first),
                                         "suffix": (suffix, {**host.record([0], a.suffix, start=1), **state})})
    contract = pair_graph.contract(model, a.prefix, a.suffix, str(form))
    out = Path(f"artifacts/pair_P{a.prefix}_S{a.suffix}.tflite")
    size = export.write(out, content, export.metadata(rec, str(form), {"P": a.prefix, "S": a.suffix}, contract))
    atomic.write_json(f"results/export_pair_P{a.prefix}_S{a.suffix}.json", {
        "P": a.prefix, "S": a.suffix, "form": str(form), "bytes": size, "seconds": clock.seconds(),
        "peak_rss_bytes": peak_rss_bytes()})
    print(f"export_pair: {out} ({size / 2**20:.1f} MiB) in {clock.seconds():.0f} s")


if __name__ == "__main__":
    run_stage(main)
