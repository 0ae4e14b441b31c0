"""DVC stage `verify_tflite` (one per L): artifacts/rows/row_L{L}.tflite in the LiteRT interpreter vs the
torch row graph, its op census, its metadata and latency (scripts/checks/tflite_verification.py) ->
results/tflite_L{L}.json and its metrics row. Fails, naming the problem, on an error over a bound, a
census violation, or when the memory-cut control does not break the global bound by
controls.min_over_threshold."""

import argparse

from scripts.checkpoint import snapshot
from scripts.checks import tflite_verification
from scripts.checks.finish import finish
from scripts.layers import kernel_form
from scripts.pipeline import layout, params
from scripts.pipeline.harness import run_stage


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, required=True)
    length = ap.parse_args().length
    p = params.load(
        ["form", "weights", "verify_tflite.latency_repeats", "verify_tflite.latency_seconds", "decision.scored_tokens"]
    )
    form = str(kernel_form.parse(p["form"]))
    limits = params.bounds(p, "verify_tflite", tflite_verification.BOUNDED)
    min_over = params.min_over_threshold(p)
    path = layout.row_path(length)
    layout.require(path, "export")
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    repeats, budget = int(p["verify_tflite"]["latency_repeats"]), float(p["verify_tflite"]["latency_seconds"])
    found = tflite_verification.verify(path, rec, snap, form, p["weights"], length, repeats, budget, p["decision"])
    finish(tflite_verification.result(found, limits, min_over))


if __name__ == "__main__":
    run_stage(main)
