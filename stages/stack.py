"""DVC stage `stack`: build the fp32 text stack from the verified snapshot and record what it is.

results/stack.json: the stack's structure (read off the built modules), its fp32 bytes, the
stage's peak resident memory against its budget (params.yaml `stack`), and the load time. A peak over
the budget fails the stage: the weights were copied somewhere they should not have been.
"""

from scripts.checkpoint import snapshot
from scripts.pipeline import atomic, bounds, layout, metrics, params, profile
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.pipeline.measure import peak_rss_bytes
from scripts.qwen35 import text_stack


def main() -> None:
    budget = params.bound_section("stack")
    rec = snapshot.load_record()
    path = snapshot.verify(rec)
    with profile.part("load the stack"):
        _, info = text_stack.load_text_stack(path)
    info.update({"repo": rec.repo, "revision": rec.revision, "source": rec.source, "peak_rss_bytes": peak_rss_bytes()})
    limit = bounds.rss_limit(budget, info["fp32_bytes"])
    info["rss_budget"] = {**budget, "limit_bytes": limit, "within": info["peak_rss_bytes"] <= limit}
    atomic.write_json(layout.result_path("stack"), info)
    metrics.write(
        "stack",
        passed=info["rss_budget"]["within"],
        bytes=info["fp32_bytes"],
        seconds=info["load_seconds"],
        peak_rss_mb=info["peak_rss_bytes"] / 2**20,
        rss_budget_mb=limit / 2**20,
    )
    print(
        f"stack: {info['layers']} layers, {info['params']} params, {info['fp32_bytes'] / 2**20:.1f} MiB fp32, "
        f"peak RSS {info['peak_rss_bytes'] / 2**20:.0f} MiB (budget {limit / 2**20:.0f} MiB)"
    )
    if not info["rss_budget"]["within"]:
        raise ClefError(
            f"stack: peak RSS {info['peak_rss_bytes'] / 2**30:.2f} GiB is over the budget "
            f"{limit / 2**30:.2f} GiB ({budget['rss_factor']} x fp32 bytes + {budget['rss_overhead_gib']} GiB)"
        )


if __name__ == "__main__":
    run_stage(main)
