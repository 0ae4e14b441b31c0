"""DVC stage `verify_tflite` (one per L): artifacts/rows/row_L{L}.tflite in the LiteRT interpreter vs the
torch row graph, its op census read from the file, its metadata, and latency ->
results/tflite_L{L}.json. Fails, naming the problem, on an error over the threshold or a census
violation (rank > 4, custom / STABLEHLO / WHILE / CUMSUM / GATHER_ND ops, int64 tensors)."""
import argparse

import torch

from scripts import atomic, clef_kernel, clef_qwen35_patch, layout, metrics, model_check, params, row_graph, snapshot
from scripts import tflite_check, tflite_file
from scripts.clef_host import Host
from scripts.errors import ClefError, run_stage


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, required=True)
    length = ap.parse_args().length
    p = params.load(["form", "verify_tflite"])
    form = str(clef_kernel.parse(p["form"]))
    limit = float(p["verify_tflite"]["max_rel_vs_torch"])
    path = layout.row_path(length)
    tflite_file.require(path, "export")
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    census = tflite_file.census(path)
    meta = tflite_file.read_metadata(path)
    problems = [f"census: {v}" for v in tflite_file.violations(census)]
    expected = {"repo": rec["repo"], "revision": rec["revision"], "form": form, "kind": "row", "L": length,
                "contract_version": row_graph.CONTRACT_VERSION}
    if meta is None:
        problems.append("metadata: no clef_litert entry")
    else:
        problems += [f"metadata: {k} is {meta.get(k)!r}, expected {v!r}" for k, v in expected.items() if meta.get(k) != v]

    model, _, _ = clef_qwen35_patch.load(snap, form)
    host = Host(snap)
    graph = row_graph.ClefRowPrefill(model, length).eval()
    runner = tflite_check.interpreter(path).get_signature_runner()
    vocab = model.config.vocab_size
    rows = []
    for kind, (n, inputs) in tflite_check.row_records(host, length, vocab).items():
        lite = tflite_check.run(runner, inputs)[0, :n]
        with torch.no_grad():
            ref = graph(**inputs)["hidden"][0, :n]
        err = tflite_check.rel(lite, ref)
        rows.append({"record": kind, "n_real": n, "rel_vs_torch": err, "finite": bool(torch.isfinite(lite).all())})
        if err > limit or not rows[-1]["finite"]:
            problems.append(f"accuracy: record {kind} (n={n}) rel_vs_torch {err:.3g} > {limit:g}")
    timing = tflite_check.latency(runner, graph, host.record(model_check.random_ids(length, vocab, length), length),
                                  int(p["verify_tflite"]["latency_repeats"]))
    doc = {"L": length, "form": form, "file": str(path), "bytes": path.stat().st_size, "threshold_rel_vs_torch": limit,
           "passed": not problems, "problems": problems, "rows": rows,
           "max_rel_vs_torch": max(r["rel_vs_torch"] for r in rows), "census": census, "metadata": meta,
           "latency": timing}
    atomic.write_json(layout.result_path(f"tflite_L{length}"), doc)
    gdn_ops = sorted(set(census["ops_per_gdn_layer"].values()))
    metrics.write(f"tflite_L{length}", passed=doc["passed"], max_rel=doc["max_rel_vs_torch"], threshold=limit, L=length,
                  bytes=path.stat().st_size, op_total=census["op_total"], max_rank=census["max_rank"],
                  ops_per_gdn_layer=max(gdn_ops) if gdn_ops else None, torch_over_litert=timing["torch_over_litert"],
                  litert_ms=1e3 * timing["litert_median_s"])
    print(f"verify_tflite L={length}: max rel vs torch {doc['max_rel_vs_torch']:.2e} (threshold {limit:g}); "
          f"{census['op_total']} ops, {gdn_ops} per GatedDeltaNet, max rank {census['max_rank']}; "
          f"torch/litert time {timing['torch_over_litert']:.2f}x")
    if problems:
        raise ClefError(f"verify_tflite L={length} failed: {problems[0]} ({len(problems)} problems)")


if __name__ == "__main__":
    run_stage(main)
