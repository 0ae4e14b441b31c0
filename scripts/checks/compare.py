"""The error metric of every check, in one place: two figures per comparison, and NaN never passes.

- global: max |x - ref| / max |ref| over the compared tensor, the figure a bound on a whole output sees;
- per position: the worst, over positions t, of ||x_t - ref_t|| / max(||ref_t||, POSITION_NORM_FLOOR x
  median_t ||ref_t||). Trained checkpoints have a few massive-activation positions and channels; next to
  them an error at an ordinary position is divided away in the global figure, and this one still shows it.
  The denominator's floor, POSITION_NORM_FLOOR = 0.25 of the record's median position norm: where a
  position's output nearly cancels (||ref_t|| tiny beside the other positions), its relative error is the
  rounding of the terms that cancel, not a fault, and stock fp32 itself cannot meet a bound there (measured
  on one checkpoint: 8.4e-4 at one position while its global figure was 2.6e-6). The median, not the mean
  or the max, because it is robust to the few massive-activation positions. An ordinary position (norm
  >= 0.25 x median) keeps its exact relative figure, so an error there is still seen.
Either side not finite: both figures are inf (NaN or inf in the output) or NaN (in the reference),
and `judge` names the key. Every bound is checked as `not value <= limit`, so NaN fails it.
The figures are computed in numpy float64 from torch tensors or numpy arrays alike, so `clef verify`
measures a release with the same formula and no torch installed.
"""

from __future__ import annotations

import math

import numpy as np

from scripts.pipeline.errors import ClefError

POSITION_NORM_FLOOR = 0.25
"""Per position, the reference norm a difference is divided by is at least this fraction of the record's
median position norm (over its finite reference positions); see the module docstring."""

NOT_FINITE = {"inf": "NaN or inf in the output", "nan": "NaN or inf in the reference"}


def float64(t) -> np.ndarray:
    """A torch tensor (any dtype, any device) or an array-like as a float64 numpy array."""
    if hasattr(t, "detach"):  # torch, imported by the caller, not here
        t = t.detach().cpu().double().numpy()
    return np.asarray(t, dtype=np.float64)


def rel(x, ref) -> float:
    """max |x - ref| / max |ref| (inf: x not finite; NaN: ref not finite)."""
    x, ref = float64(x), float64(ref)
    if not np.isfinite(ref).all():
        return float("nan")
    if not np.isfinite(x).all():
        return float("inf")
    return float(np.abs(x - ref).max() / max(float(np.abs(ref).max()), 1e-300))


def lower_median(values: np.ndarray) -> float:
    """The lower of the two middle values for an even count (torch.median's rule, kept so the figures
    recorded before numpy computed them stay the same)."""
    return float(np.sort(values)[(len(values) - 1) // 2])


def rel_per_position(x, ref, position_dim: int = -2) -> list[float]:
    """||x_t - ref_t|| / max(||ref_t||, POSITION_NORM_FLOOR x median_t ||ref_t||) at each position t along
    `position_dim` (the norm over every other axis; the median over the positions whose reference is
    finite); inf where x_t is not finite, NaN where ref_t is not."""
    x, ref = float64(x), float64(ref)
    x = np.moveaxis(x, position_dim, 0).reshape(x.shape[position_dim], -1)
    ref = np.moveaxis(ref, position_dim, 0).reshape(ref.shape[position_dim], -1)
    ref_finite = np.isfinite(ref).all(axis=-1)
    norms = np.linalg.norm(ref, axis=-1)
    floor = POSITION_NORM_FLOOR * lower_median(norms[ref_finite]) if ref_finite.any() else 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf in a non-finite row: set below
        err = np.linalg.norm(x - ref, axis=-1) / np.maximum(norms, max(floor, 1e-300))
    err[~np.isfinite(x).all(axis=-1)] = float("inf")
    err[~ref_finite] = float("nan")
    return [float(e) for e in err]


def figures(what: str, x, ref, position_dim: int | None = -2, curve: bool = False) -> dict:
    """{"rel_<what>": global, "rel_per_position_<what>": worst position} for x against ref
    (position_dim None: a tensor without positions, such as a recurrent state: the global figure only);
    curve: also "per_position_<what>", the figure at every position, which the pictures draw."""
    if tuple(x.shape) != tuple(ref.shape):
        raise ClefError(f"compare {what}: shapes {list(x.shape)} and {list(ref.shape)} differ")
    out = {f"rel_{what}": rel(x, ref)}
    if position_dim is not None:
        per = rel_per_position(x, ref, position_dim)
        out[f"rel_per_position_{what}"] = largest(per)
        if curve:
            out[f"per_position_{what}"] = per
    return out


def exceeds(value, limit: float) -> bool:
    """True when `value` breaks `limit`: over it, NaN, inf or missing."""
    return not (isinstance(value, (int, float)) and value <= limit)


def describe(key: str, value, limit: float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key} is {value} ({NOT_FINITE['nan' if math.isnan(value) else 'inf']})"
    return f"{key} {value:.3g} > {limit:g}"


WHERE = (
    "check",
    "backend",
    "mode",
    "signature",
    "layer",
    "L",
    "record",
    "p",
    "s",
    "question",
    "entry",
    "seed",
    "input_scale",
    "regime",
    "initial_state",
)


def where(row: dict) -> str:
    """`check=..., L=...: ` naming a row by its identifying keys ('' for a row without any)."""
    text = ", ".join(f"{k}={row[k]}" for k in WHERE if k in row)
    return f"{text}: " if text else ""


def judge(rows: list[dict], limits: dict[str, float]) -> list[str]:
    """One line per broken bound: limits {row key: bound}, checked in every row that has the key,
    and rows whose `finite` flag is false."""
    out = []
    for r in rows:
        if r.get("finite") is False:
            out.append(f"{where(r)}an output is not finite")
        for key, limit in limits.items():
            if key in r and exceeds(r[key], limit):
                out.append(f"{where(r)}{describe(key, r[key], limit)}")
    return out


def largest(values):
    """max of figures, NaN winning (Python's max hides a NaN that is not first); None when empty."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return float("nan") if any(isinstance(v, float) and math.isnan(v) for v in vals) else max(vals)


def worst(rows: list[dict], key: str):
    """The largest `key` over the rows that have it (NaN wins: a NaN figure is never hidden by a max)."""
    return largest(r[key] for r in rows if key in r)


def shown(value, spec: str = ".3g") -> str:
    """A figure for a log line; `n/a` where a control does not apply (None)."""
    return "n/a" if value is None else format(value, spec)


# ---- controls: a check rerun with the fault it exists to catch (scripts/checks/controls.py) ------------


def margin(control_error, threshold: float):
    """How many times its bound a fault's error is (NaN and inf: infinitely far; None: no fault)."""
    if control_error is None:
        return None
    if not math.isfinite(control_error):
        return float("inf")
    return control_error / threshold


def control_problems(name: str, control_error, threshold: float, min_over: float) -> list[str]:
    """One line when the fault `name` moves the check's figure by less than min_over x its bound.
    None: the fault does not exist in any of the check's records (recorded as not applying)."""
    if control_error is None:
        return []
    m = margin(control_error, threshold)
    if m >= min_over:
        return []
    return [
        f"control {name}: the fault gives {control_error:.3g}, {m:.3g}x the bound {threshold:g} (needs >= "
        f"{min_over:g}x): the check cannot see the failure it is named after"
    ]
