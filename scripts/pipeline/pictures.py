"""The README's pictures: Vega-Lite charts of the pipeline's records, rendered to SVG offline.

Each picture is a function of records the README's tables read too (scripts/pipeline/readme.py), so a
picture and its table cannot disagree; vl-convert-python renders it (no browser, no network), the same
bytes for the same records. The SVGs live in results/figures/, committed with the README that shows
them, as the tables are.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from scripts.pipeline.mappings import ForeignJson
from scripts.pipeline.metrics import MetricsRows

FOLDER = Path("results") / "figures"
WIDTH = 420


def svg(spec: ForeignJson) -> str:
    import vl_convert

    return vl_convert.vegalite_to_svg({"$schema": "https://vega.github.io/schema/vega-lite/v5.json", **spec})


def _shape(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).replace("_", " ")


def _drawable(data: list[dict], key: str) -> tuple[list[dict], str]:
    """The points a chart can draw, and a note naming those it cannot: Vega drops a NaN or inf silently,
    and a figure that is not finite must never vanish from a picture unsaid."""
    kept = [d for d in data if d[key] is not None and math.isfinite(d[key])]
    lost = [d for d in data if d not in kept]
    note = f" ({len(lost)} not finite, not drawn: {', '.join(sorted({d['graph'] for d in lost}))})" if lost else ""
    return kept, note


def _order(names) -> list[str]:
    """Graph labels rows first, then pairs, each by its lengths (L64 before L128)."""
    return sorted(names, key=lambda n: (n.startswith("pair"), [int(d) for d in re.findall(r"\d+", n)]))


def _graph_axis(data: list[dict]) -> ForeignJson:
    order = _order({d["graph"] for d in data})
    return {"field": "graph", "type": "nominal", "title": None, "sort": order, "axis": {"labelAngle": -30}}


def _error_axis(title: str) -> ForeignJson:
    """The `error` field on a log scale: the errors span orders of magnitude."""
    return {
        "field": "error",
        "type": "quantitative",
        "scale": {"type": "log"},
        "axis": {"format": ".0e"},
        "title": title,
    }


def errors(rows: MetricsRows) -> ForeignJson:
    """LiteRT against torch for each graph (CPU, fp32): the global figure and the worst position's, on a
    log scale under the bound they are held to."""
    data, bound = [], None
    for name, r in sorted(rows.items()):
        if not name.startswith(("tflite_", "row_", "pair_")) or r.get("max_rel") is None:
            continue
        graph = _shape(_shape(name, "tflite_"), "row_")
        data += [
            {"graph": graph, "figure": "global", "error": r["max_rel"]},
            {"graph": graph, "figure": "worst position", "error": r.get("max_rel_per_position")},
        ]
        bound = r.get("threshold", bound)
    data, note = _drawable(data, "error")
    bars = {  # points, not bars: a bar has no base on a log scale
        "mark": {"type": "point", "filled": True, "size": 90},
        "encoding": {
            "x": _graph_axis(data),
            "xOffset": {"field": "figure"},
            "y": _error_axis("max relative error"),
            "color": {"field": "figure", "type": "nominal", "title": None},
            "shape": {"field": "figure", "type": "nominal", "title": None},
        },
    }
    layers = [bars]
    if bound is not None:
        layers.append(
            {
                "data": {"values": [{"bound": bound}]},
                "mark": {"type": "rule", "strokeDash": [4, 3]},
                "encoding": {"y": {"field": "bound", "type": "quantitative"}},
            }
        )
    return {
        "title": "LiteRT vs torch per graph, fp32 on the CPU"
        + (f" (dashed: the bound {bound:g})" if bound is not None else "")
        + note,
        "width": WIDTH,
        "data": {"values": data},
        "layer": layers,
    }


def gpu_modes(rows: MetricsRows) -> ForeignJson:
    """Each GPU half mode's error over the torch-float16 floor per graph, global and worst position (1 is
    the floor itself)."""
    data = []
    for name, r in sorted(rows.items()):
        if not name.startswith("gpu_"):
            continue
        graph = _shape(_shape(name, "gpu_"), "row ")
        for mode, m in sorted((r.get("modes") or {}).items()):
            if m.get("over_floor") is None:
                continue
            data.append({"graph": graph, "series": mode, "ratio": m["over_floor"]})
            worst = m.get("over_floor_per_position")
            if worst is not None:
                data.append({"graph": graph, "series": f"{mode}, worst position", "ratio": worst})
    data, note = _drawable(data, "ratio")
    return {
        "title": f"GPU accelerator half modes over the torch float16 floor (rule: the floor){note}",
        "width": WIDTH,
        "data": {"values": data},
        "layer": [
            {
                "mark": "bar",
                "encoding": {
                    "x": _graph_axis(data),
                    "xOffset": {"field": "series"},
                    "y": {"field": "ratio", "type": "quantitative", "title": "error / floor"},
                    "color": {"field": "series", "type": "nominal", "title": None},
                },
            },
            {
                "data": {"values": [{"floor": 1}]},
                "mark": "rule",
                "encoding": {"y": {"field": "floor", "type": "quantitative"}},
            },
        ],
    }


def sizes(weights: dict) -> ForeignJson:
    """Bytes at each weights precision: the L=64 row graph and the bundle (results/weights.json)."""
    data = [
        {"precision": name, "what": f"row graph L={weights['L']}", "MB": v["bytes"] / 1e6}
        for name, v in weights["variants"].items()
    ]
    data += [
        {"precision": name, "what": "bundle (every graph; derived)", "MB": n / 1e6}
        for name, n in (weights.get("bundle") or {}).get("bytes", {}).items()
    ]
    order = sorted({d["precision"] for d in data}, key=lambda p: -max(d["MB"] for d in data if d["precision"] == p))
    return {
        "title": f"Size per weights precision ({weights['source']}, make weights-bench)",
        "width": WIDTH,
        "data": {"values": data},
        "mark": "bar",
        "encoding": {
            "x": {"field": "precision", "type": "nominal", "sort": order, "title": None, "axis": {"labelAngle": 0}},
            "xOffset": {"field": "what"},
            "y": {"field": "MB", "type": "quantitative", "title": "MB"},
            "color": {"field": "what", "type": "nominal", "title": None},
        },
    }


CPU_SERIES = "LiteRT CPU fp32 vs torch"
FLOOR_SERIES = "torch float16 vs float64 (the floor)"


@dataclasses.dataclass(frozen=True)
class Curve:
    """One series of the positions picture: its label and its figure at each position of a record."""

    series: str
    errors: list[float]


def position_series(artifact: dict) -> list[Curve]:
    """A release manifest's graph entry -> its curves, each a figure at each position of the reference
    record: the release's own run on the CPU, and each GPU accelerator mode verify_gpu ran on a record of
    that shape (fp32 against torch, the half modes and the floor against float64)."""
    out = []
    if artifact["reference"].get("positions") is not None:
        out.append(Curve(CPU_SERIES, artifact["reference"]["positions"]))
    gpu = (artifact.get("gpu") or {}).get("positions") or {}
    for key, values in gpu.items():
        if key == "record":
            continue
        if key == "floor_vs_f64":
            out.append(Curve(FLOOR_SERIES, values))
        else:
            mode, _, against = key.partition("_vs_")
            out.append(Curve(f"GPU {mode} vs {'float64' if against == 'f64' else against}", values))
    return out


def positions(artifacts: dict) -> ForeignJson:
    """Error at each position of each graph's reference record, one panel per graph, log scale: where in
    a record LiteRT departs from torch, and where the GPU's half modes depart from float64 beside the
    floor torch float16 itself reaches."""
    return _positions_chart({name: position_series(a) for name, a in artifacts.items()})


def _positions_chart(curves: dict[str, list[Curve]]) -> ForeignJson:
    """The positions picture of each graph's curves (position_series)."""
    data = []
    for name, drawn in curves.items():
        graph = _shape(name, "row_")
        for c in drawn:
            data += [{"graph": graph, "series": c.series, "position": t, "error": e} for t, e in enumerate(c.errors)]
    data, note = _drawable(data, "error")
    return {
        "title": f"Error at each position of each graph's reference record{note}",
        "data": {"values": data},
        "facet": {"field": "graph", "type": "nominal", "title": None, "sort": _order({d["graph"] for d in data})},
        "columns": 3,
        "spec": {
            "width": WIDTH // 3,
            "height": WIDTH // 4,
            "mark": {"type": "line", "strokeWidth": 1},
            "encoding": {
                "x": {"field": "position", "type": "quantitative", "title": "position"},
                "y": _error_axis("relative error"),
                "color": {"field": "series", "type": "nominal", "title": None, "legend": {"orient": "bottom"}},
            },
        },
        "resolve": {"scale": {"x": "independent"}},
    }


@dataclasses.dataclass(frozen=True)
class ReleasePicture:
    """One of the release's pictures: its file name, its title and its SVG."""

    file: str
    title: str
    svg: str


def release_pictures(artifacts: dict) -> list[ReleasePicture]:
    """The release's pictures from its manifest's figures: each graph's reference record error as measured
    at release time, and the GPU half modes verify_gpu recorded for it."""
    rows = {}
    for name, a in artifacts.items():
        ref = a["reference"]
        rows[name] = {k: ref.get(k) for k in ("max_rel", "max_rel_per_position", "threshold")}
        if (a.get("gpu") or {}).get("modes"):
            rows[f"gpu_{name}"] = {"modes": a["gpu"]["modes"]}
    out = [ReleasePicture("errors.svg", "each graph's reference record, LiteRT vs torch", svg(errors(rows)))]
    if any(n.startswith("gpu_") for n in rows):
        out.append(ReleasePicture("gpu_modes.svg", "GPU half modes over the float16 floor", svg(gpu_modes(rows))))
    curves = {name: position_series(a) for name, a in artifacts.items()}
    if any(curves.values()):
        title = "error at each position of each graph's reference record"
        out.append(ReleasePicture("positions.svg", title, svg(_positions_chart(curves))))
    return out
