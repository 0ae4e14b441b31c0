"""DVC stage `bundle`: every row graph and pair in one .tflite over one copy of the weights
(scripts/litert/bundle.py) -> artifacts/bundle/<model>-<revision[:12]>-<form>.tflite, verified against the
files it was made from (scripts/checks/bundle_check.py) -> results/bundle.json and its metrics row.

Each graph's reference record runs through its signatures in the bundle and in its own file, on the CPU
accelerator and on the GPU accelerator alone in every mode verify_gpu runs (where verify_gpu runs whole
graphs: verify_gpu.layers resolving to `all`); every output must be bit-identical. Memory: the bundle
and the largest graph, each compiled with every signature run once, in a process of their own.

Refuses, before merging, a graph that is missing, whose metadata names another revision, form or shape,
or whose reference record is missing; the bundle's metadata records each graph's metadata, the names of
its signatures in the bundle and the fingerprint of the file it came from (size, sha256 of its head). Fails, leaving
the previous bundle in place, on a census violation, a constant stored twice in the bundle's file
(read back and hashed), an output that differs, or a signature the GPU accelerator does not run whole.
"""

import shutil

from scripts.checkpoint import snapshot
from scripts.checks import bundle_check, compare
from scripts.layers import kernel_form
from scripts.litert import bundle, gpu_accelerator, tflite_file
from scripts.litert.cpu_graph import CpuGraph
from scripts.pipeline import atomic, layout, metrics, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.release import references

GPU_MODES = gpu_accelerator.MODES


def preflight(graphs: list, rec: dict, form: str, weights: str) -> dict:
    """Every graph there, of this revision, form, weights and shape, with its reference record ->
    {name: metadata}."""
    metas = {}
    for g in graphs:
        layout.require(g.path)
        layout.require(layout.reference_path(g.path))
        want = {"revision": rec["revision"], "form": form, "weights": weights, "kind": g.kind, **g.shape}
        meta = tflite_file.read_metadata(g.path)
        bad = tflite_file.metadata_mismatches(meta, want)
        if bad:
            raise ClefError(f"{g.path}: metadata {'; '.join(bad)}; rerun its export stage")
        # which file it was: the release refuses a bundle whose parts are not the graphs it has
        metas[g.name] = {**meta, "signatures": g.signatures, "file": bundle.fingerprint(g.path)}
    return metas


def identity_cpu(path, graphs: list) -> list[dict]:
    rows, whole = [], CpuGraph(path)
    try:
        for g in graphs:
            record = references.load_reference(layout.REFERENCES, layout.reference_path(g.path).name)
            own = CpuGraph(g.path)
            try:
                _, expected = bundle_check.run_record(references.interpreter_signature(own), g.kind, record)
            finally:
                own.close()
            figures, got = bundle_check.run_record(
                references.renamed(references.interpreter_signature(whole), g.signatures), g.kind, record
            )
            rows.append({"graph": g.name, "accelerator": "cpu", **figures, **bundle_check.difference(got, expected)})
            print(f"bundle: {g.name} on the CPU: identical {rows[-1]['identical']}", flush=True)
    finally:
        whole.close()
    return rows


def identity_gpu(path, graphs: list, census: dict) -> list[dict]:
    rows = []
    for mode in GPU_MODES:
        whole = gpu_accelerator.compile(path, mode, census)
        try:
            for g in graphs:
                record = references.load_reference(layout.REFERENCES, layout.reference_path(g.path).name)
                own = gpu_accelerator.compile(g.path, mode)
                try:
                    _, expected = bundle_check.run_record(own.signature, g.kind, record)
                finally:
                    own.close()
                figures, got = bundle_check.run_record(
                    references.renamed(whole.signature, g.signatures), g.kind, record
                )
                rows.append(
                    {
                        "graph": g.name,
                        "accelerator": f"gpu {mode}",
                        "fully_accelerated": whole.fully_accelerated,
                        "adapter": whole.adapter,
                        **figures,
                        **bundle_check.difference(got, expected),
                    }
                )
                print(f"bundle: {g.name} on the GPU ({mode}): identical {rows[-1]['identical']}", flush=True)
        finally:
            whole.close()
    return rows


def memory(path, largest, accelerators: tuple[str, ...]) -> dict:
    """Held and peak bytes over the runtime's own, the bundle against the largest graph, per accelerator
    (the GPU's in fp32 mode)."""
    return {accelerator: bundle_check.memory_against(path, largest, accelerator) for accelerator in accelerators}


def main() -> None:
    p = params.load(["form", "weights", "lengths", "pairs", "bundle", "verify_gpu.layers", "model.source"])
    form = str(kernel_form.parse(p["form"]))
    rec = snapshot.load_record()
    graphs = bundle_check.planned(p["lengths"], p["pairs"])
    metas = preflight(graphs, rec, form, p["weights"])
    final = layout.bundle_path(rec, form, p["weights"])
    build = atomic.partial_dir(layout.BUNDLE)
    shutil.rmtree(build, ignore_errors=True)
    try:
        path = build / final.name
        meta = {
            "kind": "bundle",
            "revision": rec["revision"],
            "repo": rec["repo"],
            "source": rec["source"],
            "form": form,
            "weights": p["weights"],
            "graphs": metas,
        }
        merged = bundle.merge([bundle.Part(g.path, g.signatures) for g in graphs], path, meta)
        census = tflite_file.census(path)
        found = tflite_file.violations(census)
        largest = max((g.path for g in graphs), key=lambda f: f.stat().st_size)
        over_graph = merged.bytes / largest.stat().st_size
        gpu_whole = params.gpu_depth(p["verify_gpu"]["layers"], p["model"]["source"]) == "all"
        gpu_takes_it = p["weights"] != "int8"  # the accelerator refuses int8 weights (verify_gpu records it)
        gpu_whole, gpu_why = (
            gpu_whole and gpu_takes_it,
            (
                "weights int8: the GPU accelerator refuses the graphs (verify_gpu records the op)"
                if not gpu_takes_it
                else f"verify_gpu.layers resolves to block for model.source {p['model']['source']}: "
                "the GPU runs sections of the first block, not whole graphs"
            ),
        )
        rows = identity_cpu(path, graphs) + (identity_gpu(path, graphs, census) if gpu_whole else [])
        problems = [f"census: {v}" for v in found]
        repeated = bundle.duplicate_constants(path)
        if repeated["buffers"]:
            problems.append(
                f"{repeated['buffers']} constants stored more than once ({repeated['bytes']} bytes): "
                "the weights are not shared"
            )
        problems += [
            f"{r['graph']} on the {r['accelerator']}: outputs differ from its own file's "
            f"(max rel {compare.shown(r['max_rel'])})"
            for r in rows
            if not r["identical"]
        ]
        problems += [
            f"{r['graph']} on the {r['accelerator']}: not every op on the GPU accelerator"
            for r in rows
            if r.get("fully_accelerated") is False
        ]
        doc = {
            "file": str(final),
            "form": form,
            "weights": p["weights"],
            "graphs": [g.name for g in graphs],
            "signatures": merged.signatures,
            "sharing": merged.as_dict(),
            "largest_graph": {"file": str(largest), "bytes": largest.stat().st_size},
            "bytes_over_graph": over_graph,
            "bytes_goal_over_graph": p["bundle"]["bytes_goal_over_graph"],
            "duplicate_constants": repeated,
            "identity": rows,
            "gpu_checked": gpu_whole,
            "gpu_not_checked_why": None if gpu_whole else gpu_why,
            "memory": memory(path, largest, ("cpu", "gpu") if gpu_whole else ("cpu",)),
            "memory_goal_over_graph": p["bundle"]["memory_goal_over_graph"],
            "census": {k: census[k] for k in ("op_total", "max_rank", "subgraphs", "dtypes")},
            "passed": not problems,
            "problems": problems,
        }
        atomic.write_json(layout.result_path("bundle"), doc)
        metrics.write(
            "bundle",
            passed=not problems,
            max_rel=max((r["max_rel"] for r in rows), default=None),
            threshold=0.0,
            bytes=merged.bytes,
            op_total=census["op_total"],
            max_rank=census["max_rank"],
        )
        if problems:
            raise ClefError(
                f"{final.name}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
            )
        atomic.swap_in_dir(build, layout.BUNDLE)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    print(
        f"bundle: {final} ({merged.bytes} bytes, {over_graph:.3f}x {largest.name}; {len(merged.signatures)} "
        f"signatures; constants {merged.constant_bytes} of {merged.part_constant_bytes} bytes stored)"
    )


if __name__ == "__main__":
    run_stage(main)
