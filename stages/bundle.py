"""DVC stage `bundle`: every row graph and pair in one .tflite over one copy of the weights
(scripts/litert/bundle.py) -> artifacts/bundle/<model>-<revision[:12]>-<form>.tflite, verified against the
files it was made from (scripts/checks/bundle_verification.py) -> results/bundle.json and its metrics row.

Refuses, before merging, a graph that is missing, whose metadata names another revision, form or shape,
or whose reference record is missing. Fails, leaving the previous bundle in place, on a census violation,
a constant stored twice, an output that differs from its own file's, or a signature the GPU accelerator
does not run whole.
"""

import shutil

from scripts.checkpoint import snapshot
from scripts.checks import bundle_check, bundle_verification
from scripts.layers import kernel_form
from scripts.litert import bundle
from scripts.pipeline import atomic, layout, metrics, params
from scripts.pipeline.errors import ClefError, first_of
from scripts.pipeline.harness import run_stage


def main() -> None:
    p = params.load(["form", "weights", "lengths", "pairs", "bundle", "verify_gpu.layers", "model.source"])
    form, weights = str(kernel_form.parse(p["form"])), p["weights"]
    rec = snapshot.load_record()
    graphs = bundle_check.planned(p["lengths"], p["pairs"])
    metas = bundle_verification.preflight(graphs, rec, form, weights)
    final = layout.bundle_path(rec, form, weights)
    build = atomic.partial_dir(layout.BUNDLE)
    shutil.rmtree(build, ignore_errors=True)
    try:
        path = build / final.name
        meta = bundle_verification.metadata(rec, form, weights, metas).to_json()
        merged = bundle.merge([bundle.Part(g.path, g.signatures) for g in graphs], path, meta)
        why = bundle_verification.gpu_not_checked_why(p["verify_gpu"]["layers"], p["model"]["source"])
        doc = bundle_verification.verify(path, final, graphs, merged, form, weights, p["bundle"], why)
        atomic.write_json(layout.result_path("bundle"), doc.to_json())
        metrics.write("bundle", **bundle_verification.metrics_row(doc).to_json())
        problems = doc.problems
        if problems:
            raise ClefError(f"{final.name}: {first_of(problems)}")
        atomic.swap_in_dir(build, layout.BUNDLE)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    print(bundle_verification.line(doc))


if __name__ == "__main__":
    run_stage(main)
