"""DVC stage `verify_kernel`: every form's chunk kernel vs float64 truth and the stock kernel, at the
checkpoint's GatedDeltaNet head counts -> results/kernel.json. Fails, naming the row, when the
configured form's fp32 error crosses a bound (global or per position), when it is not finite in fp16
in some regime, or when its memory-cut control does not break the bound by controls.min_over_threshold."""

from scripts.checkpoint import snapshot
from scripts.checks import compare, kernel_check
from scripts.checks.finish import CheckResult, finish
from scripts.layers import kernel_form
from scripts.pipeline import layout, params
from scripts.pipeline.harness import run_stage


def main() -> None:
    p = params.load(["form", "verify_kernel.forms"])
    form = str(kernel_form.parse(p["form"]))
    forms = [str(kernel_form.parse(f)) for f in p["verify_kernel"]["forms"]]
    limits = params.bounds(p, "verify_kernel", ("rel_vs_f64", "rel_per_position_vs_f64"))
    min_over = params.min_over_threshold(p)
    if form not in forms:
        forms.append(form)
    rec = snapshot.load_record()
    text = snapshot.text_config(snapshot.verify(rec, names=["config.json"]))
    heads = {
        "k": text["linear_num_key_heads"],
        "v": text["linear_num_value_heads"],
        "k_dim": text["linear_key_head_dim"],
        "v_dim": text["linear_value_head_dim"],
    }
    rows = kernel_check.check(heads, forms, control_form=form)
    summary = kernel_check.summarize(rows, form, limits, min_over)
    worst, control, fp16 = summary.max_rel_vs_f64[form], summary.control_memory_cut, summary.fp16[form]
    figures = dict(
        max_rel=worst.out,
        max_rel_per_position=worst.out_per_position,
        max_rel_state=worst.state,
        threshold=limits["rel_vs_f64"],
        threshold_per_position=limits["rel_per_position_vs_f64"],
        control_over_threshold=control.over_threshold,
        fp16_max_rel=fp16.max_out_rel_vs_f64,
        fp16_finite=fp16.all_finite,
    )
    line = (
        f"verify_kernel: {form} max rel vs float64 out {worst.out:.2e} "
        f"(per position {worst.out_per_position:.2e}) "
        f"state {worst.state:.2e} (bounds {limits['rel_vs_f64']:g}, {limits['rel_per_position_vs_f64']:g}); fp16 "
        f"finite: {fp16.all_finite}; memory-cut control {compare.shown(control.rel_vs_f64)} "
        f"({compare.shown(control.over_threshold)}x the bound)"
    )
    record = kernel_check.KernelRecord(heads, rec.revision, summary, rows)
    finish(
        CheckResult(
            "verify_kernel", "kernel", record.to_json(), layout.result_path("kernel"), figures, [line], summary.failures
        )
    )


if __name__ == "__main__":
    run_stage(main)
