"""DVC stage `latency`: every signature of every graph params.yaml asks for, timed by LiteRT's own
`litert-benchmark` on the CPU accelerator (scripts/bench/litert_benchmark.py) -> results/latency.json.
A benchmark figure, never a test: these machines are noisy."""

from scripts.bench import litert_benchmark
from scripts.checks import bundle_check
from scripts.pipeline import atomic, layout, params, provenance
from scripts.pipeline.harness import run_stage


def main() -> None:
    p = params.load(["lengths", "pairs", "latency"])
    b = p["latency"]
    runs, warmup, threads = int(b["runs"]), int(b["warmup_runs"]), int(b["threads"])
    graphs = bundle_check.planned(p["lengths"], p["pairs"])
    for g in graphs:  # every file before the first run: a missing graph is one line, not a late failure
        layout.require(g.path)
    rows = []
    for g in graphs:
        for signature in g.signatures:
            t = litert_benchmark.run(g.path, signature, runs, warmup, threads)
            rows.append(litert_benchmark.LatencyRow.of(t, g.name, g.kind, **g.shape))
            print(
                f"latency {g.name} {signature}: median {t.median_ms:.3g} ms (p5 {t.p5_ms:.3g}, "
                f"p95 {t.p95_ms:.3g}; {t.num_runs} runs, {threads} threads)",
                flush=True,
            )
    version = provenance.package_versions().get("ai-edge-litert")
    doc = litert_benchmark.LatencyReport(litert_benchmark.TOOL, version, "cpu", runs, warmup, threads, rows)
    atomic.write_json(layout.result_path("latency"), doc.to_json())


if __name__ == "__main__":
    run_stage(main)
