"""DVC stage `verify_pair` (one per pair): the pair in torch and in the LiteRT interpreter, checked by
chaining against the row graph (the prefix's hidden too), its state against transformers' cache in
float64, state reuse, and the op census -> results/pair_P{P}_S{S}.json. Fails, naming the row, past a
bound (global or per position), on a census violation, or when a control (the recurrent state zeroed,
the pad guard removed: scripts/checks/controls.py) does not break the bound by controls.min_over_threshold."""

import argparse
import gc

import torch

from scripts.checkpoint import snapshot
from scripts.checks import compare, pair_check, tflite_check
from scripts.checks.finish import CheckResult, finish
from scripts.layers import kernel_form
from scripts.litert import tflite_file
from scripts.pipeline import layout, params
from scripts.pipeline.harness import run_stage
from scripts.pipeline.progress import Phases
from scripts.qwen35 import pair_graph, patch
from scripts.qwen35.host import Host, PairRunner, litert_signature
from scripts.release import references

CONTROLS = {"zero_state": "control_zero_state_rel_vs_row", "no_pad_guard": "control_no_pad_guard_rel_vs_row"}


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
    p = params.load(["form", "weights"])
    form = str(kernel_form.parse(p["form"]))
    limits = params.bounds(
        p,
        "verify_pair",
        ("rel_vs_row", "rel_per_position_vs_row", "rel_state_vs_stock_f64", "rel_per_position_state_vs_stock_f64"),
    )
    limit = limits["rel_vs_row"]
    min_over = params.min_over_threshold(p)
    path = layout.pair_path(a.prefix, a.suffix)
    layout.require(path, "export_pair")
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    phases = ("load the stack", "torch checks", "interpreter", "LiteRT checks", "reference record")
    with Phases(f"verify_pair P={a.prefix} S={a.suffix}", phases) as phase:
        phase("load the stack")
        model, _, _ = patch.load(snap, form, weights=p["weights"])
        host = Host(snap)
        census = tflite_file.census(path)
        meta = tflite_file.read_metadata(path)
        problems = [f"census: {v}" for v in tflite_file.violations(census)]
        if set(census["signatures"]) != {"prefix", "suffix"}:
            problems.append(f"signatures {sorted(census['signatures'])}, expected prefix and suffix")
        expected = {
            "revision": rec["revision"],
            "form": form,
            "weights": p["weights"],
            "kind": "pair",
            "P": a.prefix,
            "S": a.suffix,
        }
        problems += [f"metadata: {m}" for m in tflite_file.metadata_mismatches(meta, expected)]

        # torch first: its checks fill `refs` (the row graph's and transformers' results, kept); then the
        # stack is freed and the interpreter's checks read them, so the weights are never in memory twice
        phase("torch checks")
        shapes = pair_graph.state_shapes(model, a.prefix)
        vocab = model.config.vocab_size
        refs = pair_check.References(model, host, a.prefix, a.suffix)
        runner = PairRunner(
            host,
            torch_fn(pair_graph.PairPrefix(model, a.prefix).eval()),
            torch_fn(pair_graph.PairSuffix(model, a.prefix, a.suffix).eval()),
            a.prefix,
            a.suffix,
            form,
            shapes,
        )
        rows = [{"backend": "torch", **r} for r in pair_check.check(runner, refs, vocab, pad_guard_control=True)]
        # the release packages it; `clef verify` reruns it wherever it lands
        references.save(pair_check.reference_record(refs, host, vocab), layout.reference_path(path))
        del runner, model
        refs.free()
        gc.collect()

        phase("interpreter")
        interp = tflite_check.interpreter(path)
        runner = PairRunner(
            host,
            litert_signature(interp.get_signature_runner("prefix")),
            litert_signature(interp.get_signature_runner("suffix")),
            a.prefix,
            a.suffix,
            form,
            shapes,
        )
        phase("LiteRT checks")
        rows += [{"backend": "litert", **r} for r in pair_check.check(runner, refs, vocab)]
        # the saved record read back through this graph: the figures the release states for it
        phase("reference record")
        reference = references.measure(path, "pair", interp)
    backends = ("torch", "litert")
    problems += compare.judge(rows, limits)
    found = {}
    for control, key in CONTROLS.items():
        for b in backends:
            value = compare.worst([r for r in rows if r["backend"] == b], key)
            if value is not None:  # the pad guard control runs in torch only
                found[f"{b} {control}"] = value
                problems += compare.control_problems(f"{control} ({b})", value, limit, min_over)

    def per_backend(key, check=None):
        return {
            b: compare.worst([r for r in rows if r["backend"] == b and check in (None, r["check"])], key)
            for b in backends
        }

    summary = {
        "P": a.prefix,
        "S": a.suffix,
        "form": form,
        "weights": p["weights"],
        "thresholds": limits,
        "passed": not problems,
        "problems": problems,
        "bytes": path.stat().st_size,
        "max_rel_vs_row": per_backend("rel_vs_row"),
        "max_rel_per_position_vs_row": per_backend("rel_per_position_vs_row"),
        "max_rel_prefix_hidden_vs_row": per_backend("rel_vs_row", "prefix_hidden"),
        "max_rel_state_vs_stock_f64": per_backend("rel_state_vs_stock_f64"),
        "max_rel_per_position_state_vs_stock_f64": per_backend("rel_per_position_state_vs_stock_f64"),
        "max_rel_state_vs_stock_fp32": per_backend("rel_state_vs_stock_fp32"),
        "controls": {name: {"rel_vs_row": v, "over_threshold": compare.margin(v, limit)} for name, v in found.items()},
        "controls_required_over_threshold": min_over,
    }
    name = layout.pair_name(a.prefix, a.suffix)
    record = {"summary": summary, "census": census, "metadata": meta, "reference_record": reference, "rows": rows}
    figures = dict(
        max_rel=compare.largest(summary["max_rel_vs_row"].values()),
        threshold=limit,
        max_rel_per_position=compare.largest(summary["max_rel_per_position_vs_row"].values()),
        threshold_per_position=limits["rel_per_position_vs_row"],
        control_over_threshold=min(c["over_threshold"] for c in summary["controls"].values()),
        max_rel_state=compare.largest(summary["max_rel_state_vs_stock_f64"].values()),
        P=a.prefix,
        S=a.suffix,
        bytes=path.stat().st_size,
        op_total=census["op_total"],
        max_rank=census["max_rank"],
        ops_per_gdn_layer=max(census["ops_per_gdn_layer"].values(), default=None),
    )
    shown = {
        k: {b: f"{v:.2e}" for b, v in summary[k].items()}
        for k in ("max_rel_vs_row", "max_rel_per_position_vs_row", "max_rel_state_vs_stock_f64")
    }
    line = (
        f"verify_pair P={a.prefix} S={a.suffix}: chaining max rel {shown['max_rel_vs_row']}, per position "
        f"{shown['max_rel_per_position_vs_row']}, state vs transformers float64 {shown['max_rel_state_vs_stock_f64']}; "
        f"controls {', '.join(f'{k} {v:.3g}' for k, v in found.items())}; {census['op_total']} ops, "
        f"max rank {census['max_rank']}"
    )
    stage = f"verify_pair P={a.prefix} S={a.suffix}"
    finish(CheckResult(stage, name, record, layout.result_path(name), figures, [line], problems))


if __name__ == "__main__":
    run_stage(main)
