"""DVC stage `verify_model`: the row graph (patched stack + form) against the stock twin at every L,
and causality -> results/model.json. Fails, naming the row, past a bound (global or per position),
or when the memory-cut control does not break the global bound by controls.min_over_threshold."""

from scripts.checkpoint import snapshot
from scripts.checks import compare, model_check, record_text
from scripts.checks.finish import CheckResult, finish
from scripts.layers import kernel_form
from scripts.pipeline import layout, params
from scripts.pipeline.harness import run_stage
from scripts.qwen35 import patch
from scripts.qwen35.host import Host


def main() -> None:
    p = params.load(["form", "lengths"])
    form = str(kernel_form.parse(p["form"]))
    lengths = p["lengths"]
    limits = params.bounds(p, "verify_model", ("rel_vs_stock_f64", "rel_per_position_vs_stock_f64", "rel_causality"))
    min_over = params.min_over_threshold(p)
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    model, _, _ = patch.load(path, form)
    host = Host(path)
    rows = model_check.model_rows(model, host, lengths, record_text.for_source(rec.source, host))
    control = compare.worst(rows, "control_memory_cut_rel_vs_stock_f64")
    fails = model_check.failures(rows, limits)
    fails += compare.control_problems("memory_cut", control, limits["rel_vs_stock_f64"], min_over)
    vs = [r for r in rows if r["check"] == "vs_stock"]

    def per_length(key):
        return {str(n): compare.worst([r for r in vs if r["L"] == n], key) for n in lengths}

    summary = {
        "form": form,
        "thresholds": limits,
        "passed": not fails,
        "failures": fails,
        **{
            f"max_{k}": per_length(k)
            for k in (
                "rel_vs_stock_f64",
                "rel_per_position_vs_stock_f64",
                "rel_vs_stock_fp32",
                "rel_stock_fp32_vs_f64",
                "control_memory_cut_rel_vs_stock_f64",
            )
        },
        "max_rel_causality": compare.worst(rows, "rel_causality"),
        "control_memory_cut": {
            "rel_vs_stock_f64": control,
            "over_threshold": compare.margin(control, limits["rel_vs_stock_f64"]),
            "required_over_threshold": min_over,
        },
        "all_finite": all(r["finite"] for r in rows),
    }
    figures = dict(
        max_rel=compare.worst(vs, "rel_vs_stock_f64"),
        max_rel_per_position=compare.worst(vs, "rel_per_position_vs_stock_f64"),
        threshold=limits["rel_vs_stock_f64"],
        threshold_per_position=limits["rel_per_position_vs_stock_f64"],
        control_over_threshold=summary["control_memory_cut"]["over_threshold"],
        max_rel_fp32=compare.worst(vs, "rel_vs_stock_fp32"),
    )
    lines = [
        f"verify_model L={n}: rel vs stock float64 {summary['max_rel_vs_stock_f64'][n]:.2e}, per position "
        f"{summary['max_rel_per_position_vs_stock_f64'][n]:.2e}; "
        f"vs stock fp32 {summary['max_rel_vs_stock_fp32'][n]:.2e} "
        f"(stock fp32 vs its float64 {summary['max_rel_stock_fp32_vs_f64'][n]:.2e}); memory-cut control "
        f"{compare.shown(summary['max_control_memory_cut_rel_vs_stock_f64'][n])}"
        for n in map(str, lengths)
    ]
    record = {"revision": rec.revision, "summary": summary, "rows": rows}
    finish(CheckResult("verify_model", "model", record, layout.result_path("model"), figures, lines, fails))


if __name__ == "__main__":
    run_stage(main)
