"""DVC stage `verify_layers`: every GatedDeltaNet of the checkpoint, patched and under the form,
against transformers' stock class -> results/layers.json. Fails, naming the row, past the threshold."""
from scripts import atomic, clef_kernel, layout, metrics, model_check, params, snapshot, text_stack
from scripts.errors import ClefError, run_stage


def main() -> None:
    p = params.load(["form", "verify_layers"])
    form = str(clef_kernel.parse(p["form"]))
    limit = float(p["verify_layers"]["max_rel_vs_stock_f64"])
    rec = snapshot.load_record()
    model, _ = text_stack.load_text_stack(snapshot.verify(rec))
    rows = model_check.layer_rows(model, form)
    fails = model_check.failures(rows, {"rel_vs_stock_f64": limit})
    summary = {"form": form, "threshold_rel_vs_stock_f64": limit, "passed": not fails, "failures": fails,
               "layers": sorted({r["layer"] for r in rows}),
               "max_rel_vs_stock_f64": max(r["rel_vs_stock_f64"] for r in rows),
               "max_rel_vs_stock_fp32": max(r["rel_vs_stock_fp32"] for r in rows),
               "max_stock_fp32_vs_f64": max(r["stock_fp32_vs_f64"] for r in rows),
               "all_finite": all(r["finite"] for r in rows),
               "interleave_calls_per_forward": sorted({r["interleave_calls"] for r in rows})}
    atomic.write_json(layout.result_path("layers"), {"revision": rec["revision"], "summary": summary, "rows": rows})
    metrics.write("layers", passed=summary["passed"], max_rel=summary["max_rel_vs_stock_f64"], threshold=limit,
                  max_rel_fp32=summary["max_rel_vs_stock_fp32"])
    print(f"verify_layers: {form} on {len(summary['layers'])} GatedDeltaNets: max rel vs stock float64 "
          f"{summary['max_rel_vs_stock_f64']:.2e} (threshold {limit:g}); vs stock fp32 "
          f"{summary['max_rel_vs_stock_fp32']:.2e}, stock fp32 vs its float64 {summary['max_stock_fp32_vs_f64']:.2e}")
    if fails:
        raise ClefError(f"verify_layers failed: {fails[0]} ({len(fails)} rows over)")


if __name__ == "__main__":
    run_stage(main)
