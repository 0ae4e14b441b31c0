"""DVC stage `verify_pair` (one per pair): the pair in torch and in the LiteRT interpreter, checked by
chaining against the row graph, its state against transformers' cache, state reuse, and the op census
-> results/pair_P{P}_S{S}.json. Fails, naming the row, past a threshold or on a census violation."""
import argparse

import torch

from scripts import atomic, clef_kernel, clef_qwen35_patch, layout, metrics, pair_check, pair_graph, params, snapshot
from scripts import tflite_check, tflite_file
from scripts.clef_host import Host, PairRunner, litert_signature
from scripts.errors import ClefError, run_stage


def torch_fn(module):
    def call(**inputs):
        with torch.no_grad():
            return dict(module(**inputs))

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, required=True)
    ap.add_argument("--suffix", type=int, required=True)
    a = ap.parse_args()
    p = params.load(["form", "verify_pair"])
    form = str(clef_kernel.parse(p["form"]))
    limit = float(p["verify_pair"]["max_rel_vs_row"])
    state_limit = float(p["verify_pair"]["max_rel_state_vs_transformers"])
    path = layout.pair_path(a.prefix, a.suffix)
    tflite_file.require(path, "export_pair")
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    model, _, _ = clef_qwen35_patch.load(snap, form)
    host = Host(snap)
    census = tflite_file.census(path)
    meta = tflite_file.read_metadata(path) or {}
    problems = [f"census: {v}" for v in tflite_file.violations(census)]
    if set(census["signatures"]) != {"prefix", "suffix"}:
        problems.append(f"signatures {sorted(census['signatures'])}, expected prefix and suffix")
    expected = {"revision": rec["revision"], "form": form, "kind": "pair", "P": a.prefix, "S": a.suffix}
    problems += [f"metadata: {k} is {meta.get(k)!r}, expected {v!r}" for k, v in expected.items() if meta.get(k) != v]

    shapes = pair_graph.state_shapes(model, a.prefix)
    runners = {"torch": PairRunner(host, torch_fn(pair_graph.PairPrefix(model, a.prefix).eval()),
                                   torch_fn(pair_graph.PairSuffix(model, a.prefix, a.suffix).eval()),
                                   a.prefix, a.suffix, form, shapes)}
    interp = tflite_check.interpreter(path)
    runners["litert"] = PairRunner(host, litert_signature(interp.get_signature_runner("prefix")),
                                   litert_signature(interp.get_signature_runner("suffix")), a.prefix, a.suffix, form, shapes)
    rows = []
    for backend, runner in runners.items():
        for r in pair_check.check(runner, model, model.config.vocab_size):
            r["backend"] = backend
            rows.append(r)
            key, lim = ("max_rel", state_limit) if r["check"] == "state_vs_transformers" else ("rel_vs_row", limit)
            if r[key] > lim or not r.get("finite", True):
                problems.append(f"{backend} {r['check']} p={r['p']} s={r.get('s')}: {key} {r[key]:.3g} > {lim:g}")
    summary = {"P": a.prefix, "S": a.suffix, "form": form, "passed": not problems, "problems": problems,
               "bytes": path.stat().st_size,
               "max_rel_vs_row": {b: max(r["rel_vs_row"] for r in rows if r["backend"] == b and "rel_vs_row" in r)
                                  for b in runners},
               "max_rel_state_vs_transformers": {b: next(r["max_rel"] for r in rows if r["backend"] == b and
                                                         r["check"] == "state_vs_transformers") for b in runners}}
    name = layout.pair_name(a.prefix, a.suffix)
    atomic.write_json(layout.result_path(name), {"summary": summary, "census": census, "metadata": meta, "rows": rows})
    metrics.write(name, passed=summary["passed"], max_rel=max(summary["max_rel_vs_row"].values()), threshold=limit,
                  max_rel_state=max(summary["max_rel_state_vs_transformers"].values()), P=a.prefix, S=a.suffix,
                  bytes=path.stat().st_size, op_total=census["op_total"], max_rank=census["max_rank"],
                  ops_per_gdn_layer=max(census["ops_per_gdn_layer"].values(), default=None))
    print(f"verify_pair P={a.prefix} S={a.suffix}: chaining max rel {summary['max_rel_vs_row']}, state vs "
          f"transformers {summary['max_rel_state_vs_transformers']}, {census['op_total']} ops, max rank {census['max_rank']}")
    if problems:
        raise ClefError(f"verify_pair P={a.prefix} S={a.suffix} failed: {problems[0]} ({len(problems)} problems)")


if __name__ == "__main__":
    run_stage(main)
