"""Pass/fail bounds: the params.yaml keys that decide whether a stage passes, not what it computes (the
memory budgets, the error thresholds, the controls' margin, the GPU's floor target).

No stage declares them in dvc.yaml, so changing one reruns no stage and invalidates no output computed
under other values. check_params, which reruns on any edit of params.yaml, holds instead every figure
already recorded under results/ to the values params.yaml holds now (`problems`), and refuses a bound a
recorded figure fails before any stage runs. A stage that runs for another reason holds its own new
figures to the same values. A record keeps the bounds its run was held to.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from scripts.pipeline import layout

# The keys whose value only decides pass or fail. A section named alone is all of its keys.
KEYS = (
    "memory",
    "stack",
    "controls",
    "verify_kernel.max_rel_vs_f64",
    "verify_kernel.max_rel_per_position_vs_f64",
    "verify_layers",
    "verify_model",
    "verify_tflite.max_rel_vs_torch",
    "verify_tflite.max_rel_per_position_vs_torch",
    "verify_tflite.max_rel_dynamic_kernels",
    "verify_tflite.max_rel_per_position_dynamic_kernels",
    "verify_pair",
    "verify_gpu.max_rel_fp32",
    "verify_gpu.max_rel_per_position_fp32",
    "verify_gpu.fp16_max_over_floor",
    "verify_gpu.held_to_floor",
    "decision.max_kld_mean",
    "decision.min_same_top",
    "decision.enforced",
    "decision.held_at_weights",
)


def is_bound(key: str) -> bool:
    """True when params key `key` (`section` or `section.key`) is a bound or holds one."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in KEYS)


@dataclass(frozen=True)
class Bounded:
    """A recorded figure and the params key that bounds it from above: `figure` is a dotted path into
    each record matching `records` (under the repository root); a dict there counts by its largest value."""

    records: str
    figure: str
    key: str


def _global_and_per_position(row: str, section: str, bound: str, per_position_bound: str) -> tuple[Bounded, ...]:
    """A metrics row's two errors (results/metrics/<row>.json: max_rel and max_rel_per_position), each
    bounded by its key in params.yaml `section`."""
    records = f"results/metrics/{row}.json"
    return (
        Bounded(records, "max_rel", f"{section}.{bound}"),
        Bounded(records, "max_rel_per_position", f"{section}.{per_position_bound}"),
    )


def _pair_summary(figure: str, key: str | None = None) -> Bounded:
    """A figure of verify_pair's summary (results/pair_P*_S*.json), bounded by verify_pair.<key> (the
    figure's own name by default)."""
    return Bounded("results/pair_P*_S*.json", f"summary.{figure}", f"verify_pair.{key or figure}")


FIGURES = (
    Bounded("results/metrics/kernel.json", "max_rel", "verify_kernel.max_rel_vs_f64"),
    Bounded("results/metrics/kernel.json", "max_rel_state", "verify_kernel.max_rel_vs_f64"),
    Bounded("results/metrics/kernel.json", "max_rel_per_position", "verify_kernel.max_rel_per_position_vs_f64"),
    *_global_and_per_position("layers", "verify_layers", "max_rel_vs_stock_f64", "max_rel_per_position_vs_stock_f64"),
    *_global_and_per_position("model", "verify_model", "max_rel_vs_stock_f64", "max_rel_per_position_vs_stock_f64"),
    Bounded("results/model.json", "summary.max_rel_causality", "verify_model.max_rel_causality"),
    *_global_and_per_position("tflite_L*", "verify_tflite", "max_rel_vs_torch", "max_rel_per_position_vs_torch"),
    Bounded("results/tflite_L*.json", "max_rel_dynamic_kernels", "verify_tflite.max_rel_dynamic_kernels"),
    Bounded(
        "results/tflite_L*.json",
        "max_rel_per_position_dynamic_kernels",
        "verify_tflite.max_rel_per_position_dynamic_kernels",
    ),
    _pair_summary("max_rel_vs_row"),
    _pair_summary("max_rel_prefix_hidden_vs_row", "max_rel_vs_row"),
    _pair_summary("max_rel_per_position_vs_row"),
    _pair_summary("max_rel_state_vs_stock_f64"),
    _pair_summary("max_rel_per_position_state_vs_stock_f64"),
    *_global_and_per_position("gpu_*", "verify_gpu", "max_rel_fp32", "max_rel_per_position_fp32"),
)

# Metrics rows whose control figure (control_over_threshold x the row's threshold: the fault's error) must
# be at least controls.min_over_threshold x the bound in params.yaml now.
CONTROLLED = (
    ("results/metrics/kernel.json", "verify_kernel.max_rel_vs_f64"),
    ("results/metrics/layers.json", "verify_layers.max_rel_vs_stock_f64"),
    ("results/metrics/model.json", "verify_model.max_rel_vs_stock_f64"),
    ("results/metrics/tflite_L*.json", "verify_tflite.max_rel_vs_torch"),
    ("results/metrics/pair_P*_S*.json", "verify_pair.max_rel_vs_row"),
)


def memory_limit(budget: dict, fp32_stack_bytes: int | None) -> int:
    """params.yaml `memory` -> a stage's limit on peak anonymous memory, in bytes (0 stack bytes before
    the stack stage has run)."""
    return int(float(budget["factor"]) * (fp32_stack_bytes or 0) + float(budget["overhead_gib"]) * 2**30)


def rss_limit(budget: dict, fp32_stack_bytes: int) -> int:
    """params.yaml `stack` -> the stack stage's limit on its peak RSS, in bytes."""
    return int(float(budget["rss_factor"]) * fp32_stack_bytes + float(budget["rss_overhead_gib"]) * 2**30)


def value(params: dict, key: str):
    """The value of dotted key `key` in params."""
    for part in key.split("."):
        params = params[part]
    return params


def figure(record: dict, path: str) -> float | None:
    """The number at dotted `path` in `record` (the largest value of a dict; NaN when one is NaN), None
    when the record has none (a control that does not apply)."""
    for part in path.split("."):
        record = record.get(part) if isinstance(record, dict) else None
    if isinstance(record, dict):
        found = [v for v in record.values() if v is not None]
        return max(found, key=lambda v: math.inf if math.isnan(v) else v) if found else None
    return record


def exceeds(measured: float, bound: float) -> bool:
    """A figure fails its upper bound when over it or not a number (NaN never passes)."""
    return not measured <= bound


def passed(record: dict) -> bool:
    """False for the record of a run that failed its own check or budget."""
    verdicts = (
        record.get("passed"),
        record.get("summary", {}).get("passed"),
        record.get("memory_budget", {}).get("within"),
        record.get("rss_budget", {}).get("within"),
    )
    return False not in verdicts


def problems(params: dict, root: str | Path = ".") -> list[str]:
    """Each recorded figure under `root`'s results/ that the bounds in `params` fail, one line each."""
    root = Path(root)
    found = []

    def records(pattern: str):
        """The records of runs that passed: a failed run is not in dvc.lock, its stage reruns anyway."""
        for path in sorted(root.glob(pattern)):
            rec = json.loads(path.read_text())
            if passed(rec):
                yield path.relative_to(root), rec

    def refuse(key: str, bound: float, what: str, path: Path, unit: str = "") -> None:
        found.append(
            f"params.yaml {key}: a bound of {bound:.3g}{' ' + unit if unit else ''} fails {what} already recorded "
            f"in {path}; a bound decides pass or fail and reruns no stage: keep one every recorded figure meets"
        )

    for b in FIGURES:
        bound = value(params, b.key)
        for path, rec in records(b.records):
            measured = figure(rec, b.figure)
            if measured is not None and exceeds(measured, bound):
                refuse(b.key, bound, f"{b.figure} {measured:.3g} ({layout.producer_of(path)})", path)
    need = float(params["controls"]["min_over_threshold"])
    for pattern, key in CONTROLLED:
        bound = value(params, key)
        for path, rec in records(pattern):
            if rec.get("control_over_threshold") is None:
                continue  # no record spans what the control breaks (a graph of one chunk)
            fault = rec["control_over_threshold"] * rec["threshold"]
            if not fault >= need * bound:
                found.append(
                    f"params.yaml controls.min_over_threshold x {key}: {need:g} x {bound:g} is over the error "
                    f"{fault:.3g} of the control recorded in {path} ({layout.producer_of(path)}): a check at "
                    "these bounds would no longer be shown to fail when its fault is injected"
                )
    target = float(params["verify_gpu"]["fp16_max_over_floor"])
    for mode in params["verify_gpu"]["held_to_floor"]:
        for path, rec in records(f"{layout.GPU}/*.json"):
            for what in ("over_floor", "over_floor_per_position"):
                measured = figure(rec, f"modes.{mode}.{what}")
                if measured is not None and exceeds(measured, target):
                    refuse(
                        "verify_gpu.fp16_max_over_floor",
                        target,
                        f"the {mode} mode's {what} {measured:.3g} ({layout.producer_of(path)})",
                        path,
                    )
    section = params["decision"]
    for pattern in ("results/tflite_L*.json", "results/pair_P*_S*.json", f"{layout.GPU}/*.json"):
        for path, rec in records(pattern):
            made = rec.get("decision") or {}
            if made.get("weights") not in section["held_at_weights"]:
                continue  # what the storage does to the decisions is recorded, not held
            for place in section["enforced"]:
                f = made.get("places", {}).get(place)
                if f is None:
                    continue
                where = f"({layout.producer_of(path)})"
                if exceeds(f["kld_mean"], section["max_kld_mean"][place]):
                    refuse(
                        f"decision.max_kld_mean.{place}",
                        section["max_kld_mean"][place],
                        f"the {place} mean KLD {f['kld_mean']:.3g} {where}",
                        path,
                    )
                if not f["same_top"] >= section["min_same_top"][place]:
                    refuse(
                        f"decision.min_same_top.{place}",
                        section["min_same_top"][place],
                        f"the {place} same-top share {f['same_top']:.4g} {where}",
                        path,
                    )
    for path, rec in records(f"{layout.RUNTIME}/*.json"):
        if "memory_budget" in rec:  # not a benchmark, run without a budget
            limit = memory_limit(params["memory"], rec["memory_budget"]["fp32_stack_bytes"])
            if exceeds(rec["peak_anon_bytes"], limit):
                refuse(
                    "memory",
                    limit / 2**30,
                    f"stage {rec['stage']}'s peak anonymous memory {rec['peak_anon_bytes'] / 2**30:.3f} GiB",
                    path,
                    "GiB",
                )
    for path, rec in records(str(layout.result_path("stack"))):
        limit = rss_limit(params["stack"], rec["fp32_bytes"])
        if exceeds(rec["peak_rss_bytes"], limit):
            refuse("stack", limit / 2**30, f"the peak RSS {rec['peak_rss_bytes'] / 2**30:.3f} GiB", path, "GiB")
    return found
