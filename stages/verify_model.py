"""DVC stage `verify_model`: the row graph (patched stack + form) against the stock twin at every L,
and pad invariance -> results/model.json. Fails, naming the row, past a threshold."""
import json

from scripts import atomic, clef_kernel, clef_qwen35_patch, layout, metrics, model_check, params, snapshot
from scripts.clef_host import Host
from scripts.errors import ClefError, run_stage


def main() -> None:
    p = params.load(["form", "lengths", "verify_model"])
    form = str(clef_kernel.parse(p["form"]))
    lengths = params.check_lengths(p["lengths"])
    limits = {"rel_vs_stock_f64": float(p["verify_model"]["max_rel_vs_stock_f64"]),
              "rel_garbage_vs_zero_pads": float(p["verify_model"]["max_rel_pad_invariance"]),
              "rel_f64_garbage_vs_zero_pads": float(p["verify_model"]["max_rel_pad_invariance"]),
              "rel_f64_no_pads_vs_zero_pads": float(p["verify_model"]["max_rel_pad_invariance"])}
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    vocab = json.loads((path / "config.json").read_text())["text_config"]["vocab_size"]
    model, _, _ = clef_qwen35_patch.load(path, form)
    rows = model_check.model_rows(model, Host(path), lengths, vocab)
    fails = model_check.failures(rows, limits)
    vs = [r for r in rows if r["check"] == "vs_stock"]
    summary = {"form": form, "thresholds": limits, "passed": not fails, "failures": fails,
               "max_rel_vs_stock_f64": {str(n): max(r["rel_vs_stock_f64"] for r in vs if r["L"] == n) for n in lengths},
               "max_rel_vs_stock_fp32": {str(n): max(r["rel_vs_stock_fp32"] for r in vs if r["L"] == n) for n in lengths},
               "max_stock_fp32_vs_f64": {str(n): max(r["stock_fp32_vs_f64"] for r in vs if r["L"] == n) for n in lengths},
               "all_finite": all(r["finite"] for r in rows)}
    atomic.write_json(layout.result_path("model"), {"revision": rec["revision"], "summary": summary, "rows": rows})
    metrics.write("model", passed=summary["passed"], max_rel=max(summary["max_rel_vs_stock_f64"].values()),
                  threshold=limits["rel_vs_stock_f64"], max_rel_fp32=max(summary["max_rel_vs_stock_fp32"].values()))
    for n in lengths:
        print(f"verify_model L={n}: rel vs stock float64 {summary['max_rel_vs_stock_f64'][str(n)]:.2e}, "
              f"vs stock fp32 {summary['max_rel_vs_stock_fp32'][str(n)]:.2e} "
              f"(stock fp32 vs its float64 {summary['max_stock_fp32_vs_f64'][str(n)]:.2e})")
    if fails:
        raise ClefError(f"verify_model failed: {fails[0]} ({len(fails)} rows over)")


if __name__ == "__main__":
    run_stage(main)
