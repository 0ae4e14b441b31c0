"""DVC stage `verify_kernel`: every form's chunk kernel vs float64 truth and the stock kernel, at the
checkpoint's GatedDeltaNet head counts -> results/kernel.json. Fails, naming the row, when the
configured form's fp32 error crosses params.yaml's threshold."""
import json

from scripts import atomic, layout, metrics, clef_kernel, kernel_check, params, snapshot
from scripts.errors import ClefError, run_stage


def main() -> None:
    p = params.load(["form", "verify_kernel"])
    form = str(clef_kernel.parse(p["form"]))
    forms = [str(clef_kernel.parse(f)) for f in p["verify_kernel"]["forms"]]
    threshold = float(p["verify_kernel"]["max_rel_vs_f64"])
    if form not in forms:
        forms.append(form)
    rec = snapshot.load_record()
    config = snapshot.verify(rec, names=["config.json"]) / "config.json"
    text = json.loads(config.read_text())["text_config"]
    heads = {"k": text["linear_num_key_heads"], "v": text["linear_num_value_heads"],
             "k_dim": text["linear_key_head_dim"], "v_dim": text["linear_value_head_dim"]}
    rows = kernel_check.check(heads, forms)
    summary = kernel_check.summarize(rows, form, threshold)
    atomic.write_json(layout.result_path("kernel"), {"heads": heads, "revision": rec["revision"], "summary": summary,
                                              "rows": rows})
    worst = summary["max_rel_vs_f64"][form]
    metrics.write("kernel", passed=summary["passed"], max_rel=worst["out"], max_rel_state=worst["state"],
                  threshold=threshold, fp16_max_rel=summary["fp16"][form]["max_out_rel_vs_f64"])
    print(f"verify_kernel: {form} max rel vs float64 out {worst['out']:.2e} state {worst['state']:.2e} "
          f"(threshold {threshold:g}); fp16 finite: {summary['fp16'][form]['all_finite']}")
    if not summary["passed"]:
        raise ClefError(f"verify_kernel failed: {summary['failures'][0]} ({len(summary['failures'])} rows over)")


if __name__ == "__main__":
    run_stage(main)
