"""DVC stage `kernel_bench`: the form's kernel vs the stock loop kernel in torch at clef-flash's head
sizes -> results/kernel_bench.json (median time ratio in one run, torch.export node counts).
A benchmark figure, never a test: these machines are noisy."""

from scripts.checks import kernel_check
from scripts.layers import kernel_form
from scripts.pipeline import atomic, layout, metrics, params
from scripts.pipeline.harness import run_stage


def main() -> None:
    p = params.load(["form", "kernel_bench"])
    form = str(kernel_form.parse(p["form"]))
    b = p["kernel_bench"]
    doc = kernel_check.bench(
        form, int(b["heads"]), int(b["head_dim"]), [int(x) for x in b["lengths"]], int(b["repeats"])
    )
    atomic.write_json(layout.result_path("kernel_bench"), doc.to_json())
    top = max(doc.rows, key=lambda r: r.L)
    metrics.write(
        "kernel_bench",
        L=top.L,
        eager_time_stock_over_form=top.speedup_stock_over_form,
        export_nodes_stock_over_form=top.export_nodes_stock / top.export_nodes_form,
    )
    for r in doc.rows:
        print(
            f"kernel_bench L={r.L}: stock/form time {r.speedup_stock_over_form:.2f}x, "
            f"export nodes {r.export_nodes_stock} -> {r.export_nodes_form}"
        )


if __name__ == "__main__":
    run_stage(main)
