"""DVC stage `verify_layers`: every GatedDeltaNet of the checkpoint, patched and under the form,
against transformers' stock class -> results/layers.json. Fails, naming the row, past a bound (global
or per position), or when the memory-cut control does not break the global bound by
controls.min_over_threshold."""

from scripts.checkpoint import snapshot
from scripts.checks import compare, model_check
from scripts.checks.finish import CheckResult, finish
from scripts.layers import kernel_form
from scripts.pipeline import layout, params
from scripts.pipeline.harness import run_stage
from scripts.qwen35 import text_stack


def main() -> None:
    p = params.load(["form"])
    form = str(kernel_form.parse(p["form"]))
    limits = params.bounds(p, "verify_layers", ("rel_vs_stock_f64", "rel_per_position_vs_stock_f64"))
    min_over = params.min_over_threshold(p)
    rec = snapshot.load_record()
    model, _ = text_stack.load_text_stack(snapshot.verify(rec))
    rows = model_check.layer_rows(model, form)
    control = compare.worst(rows, "control_memory_cut_rel_vs_stock_f64")
    fails = model_check.failures(rows, limits)
    fails += compare.control_problems("memory_cut", control, limits["rel_vs_stock_f64"], min_over)
    worst = {
        k: compare.worst(rows, k)
        for k in (
            "rel_vs_stock_f64",
            "rel_per_position_vs_stock_f64",
            "rel_vs_stock_fp32",
            "rel_per_position_vs_stock_fp32",
            "rel_stock_fp32_vs_f64",
        )
    }
    summary = {
        "form": form,
        "thresholds": limits,
        "passed": not fails,
        "failures": fails,
        "layers": sorted({r["layer"] for r in rows}),
        **{f"max_{k}": v for k, v in worst.items()},
        "control_memory_cut": {
            "rel_vs_stock_f64": control,
            "over_threshold": compare.margin(control, limits["rel_vs_stock_f64"]),
            "required_over_threshold": min_over,
        },
        "all_finite": all(r["finite"] for r in rows),
        "interleave_calls_per_forward": sorted({r["interleave_calls"] for r in rows}),
    }
    figures = dict(
        max_rel=worst["rel_vs_stock_f64"],
        max_rel_per_position=worst["rel_per_position_vs_stock_f64"],
        threshold=limits["rel_vs_stock_f64"],
        threshold_per_position=limits["rel_per_position_vs_stock_f64"],
        control_over_threshold=summary["control_memory_cut"]["over_threshold"],
        max_rel_fp32=worst["rel_vs_stock_fp32"],
    )
    line = (
        f"verify_layers: {form} on {len(summary['layers'])} GatedDeltaNets: max rel vs stock float64 "
        f"{worst['rel_vs_stock_f64']:.2e}, per position {worst['rel_per_position_vs_stock_f64']:.2e} (bounds "
        f"{limits['rel_vs_stock_f64']:g}, {limits['rel_per_position_vs_stock_f64']:g}); vs stock fp32 "
        f"{worst['rel_vs_stock_fp32']:.2e}, stock fp32 vs its float64 {worst['rel_stock_fp32_vs_f64']:.2e}; "
        f"memory-cut control {compare.shown(control)} "
        f"({compare.shown(summary['control_memory_cut']['over_threshold'])}x the bound)"
    )
    record = {"revision": rec.revision, "summary": summary, "rows": rows}
    finish(CheckResult("verify_layers", "layers", record, layout.result_path("layers"), figures, [line], fails))


if __name__ == "__main__":
    run_stage(main)
