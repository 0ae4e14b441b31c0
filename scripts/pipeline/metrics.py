"""The compact figures of every check, one flat JSON per check under results/metrics/.

All checks share the few keys below, so `dvc metrics show` (and `dvc metrics diff` between
experiments) lines them up as one table: a row per check, a column per kind of figure. The detailed
records stay in results/<check>.json; these are the headline numbers the release manifest carries.
"""

from __future__ import annotations

from scripts.pipeline import atomic, layout

MetricsRows = dict[str, dict]
"""Check name -> its row under results/metrics/ (<name>.json, keys from KEYS), as the README's tables and
pictures read them: which checks there are is the run's data."""

KEYS = {
    "passed": "every row of the check within its threshold",
    "max_rel": "the check's headline error: max |diff| / max |reference| over its rows",
    "threshold": "the bound max_rel is held to (params.yaml)",
    "max_rel_per_position": "the worst position's error: max over positions of ||diff|| / ||reference||",
    "threshold_per_position": "the bound max_rel_per_position is held to (params.yaml)",
    "control_over_threshold": "the check's figure with its fault injected (scripts/checks/controls.py), in "
    "multiples of the bound; the worst (smallest) of the check's controls",
    "max_rel_fp32": "the same comparison against the stock fp32 run (recorded, not bounded)",
    "max_rel_state": "the model state's error (kernel: vs float64; pair: vs transformers' cache)",
    "fp16_finite": "the configured form finite in fp16 in every regime",
    "fp16_max_rel": "the check's half-precision run vs float64 (kernel: torch float16; gpu: the accelerator's "
    "fp16 mode)",
    "fp16_over_floor": "fp16_max_rel / the floor (stock transformers in torch float16 vs float64 on the same "
    "records), worst record (target: params.yaml verify_gpu.fp16_max_over_floor); per position and the "
    "floor itself: the check's record under results/gpu/",
    "mixed_over_floor": "the same ratio for the accelerator's mixed mode (fp16 storage, fp32 accumulation)",
    "fully_accelerated": "every op of every signature the GPU accelerator ran (compiled without CPU fallback)",
    "layers_checked": "the decoder layers the GPU accelerator ran (params.yaml verify_gpu.layers)",
    "L": "row graph length",
    "P": "pair prefix length",
    "S": "pair suffix length",
    "bytes": "file size",
    "op_total": "ops in the .tflite",
    "max_rank": "largest tensor rank",
    "ops_per_gdn_layer": "ops of the largest GatedDeltaNet layer in the .tflite",
    "torch_over_litert": "torch eager time / LiteRT interpreter time, medians of one run",
    "litert_ms": "LiteRT interpreter time per record, median of one run, ms",
    "seconds": "stage wall time",
    "peak_rss_mb": "stage peak resident memory, MiB",
    "rss_budget_mb": "the peak resident memory the stage is held to (params.yaml), MiB",
    "gdn_ops_stock_over_form": "ops per GatedDeltaNet, stock loop kernel / form",
    "convert_time_stock_over_form": "conversion time, stock loop kernel / form",
    "litert_time_stock_over_form": "interpreter time, stock loop kernel / form",
    "eager_time_stock_over_form": "torch kernel time, stock / form, at the largest benchmarked L",
    "export_nodes_stock_over_form": "torch.export nodes, stock kernel / form, at the largest benchmarked L",
}


def write(name: str, **figures) -> None:
    """results/metrics/<name>.json from keyword figures (each a KEYS entry; None values dropped)."""
    unknown = sorted(set(figures) - set(KEYS))
    if unknown:
        raise ValueError(f"metrics {name}: unknown keys {unknown}; add them to scripts/metrics.KEYS")
    doc = {k: v for k, v in figures.items() if v is not None}
    atomic.write_json(layout.metrics_path(name), doc)
