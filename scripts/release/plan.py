"""What a release ships, as params.yaml asks for it: each graph (bundle_check.planned: name, kind,
shape, file, signature names), the checks that vouch for it (its verify, export and GPU stages'
metrics rows) and the bounds its verify stage held it to, which its reference record is held to too.
"""

from __future__ import annotations

import dataclasses

from scripts.checks import bundle_check
from scripts.pipeline import layout, params


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A relative-error bound over the whole output and the one at each position."""

    overall: float
    per_position: float


@dataclasses.dataclass(frozen=True)
class PlannedGraph(bundle_check.Graph):
    """One graph the release ships, with its GPU check's name, every check that must have passed for
    it (the GPU check included), and its bounds."""

    gpu: str
    checks: tuple[str, ...]
    bounds: Bounds


def graph_bounds(p: dict, section: str, what: str) -> Bounds:
    """The bounds a graph's verify stage (params.yaml `section`) held it to, on its `what` figure."""
    found = params.bounds(p, section, (f"rel_{what}", f"rel_per_position_{what}"))
    return Bounds(found[f"rel_{what}"], found[f"rel_per_position_{what}"])


def planned(p: dict) -> list[PlannedGraph]:
    """The graphs params.yaml asks for, in the bundle's order, each with its checks and bounds."""
    out = []
    for g in bundle_check.planned(p["lengths"], p["pairs"]):
        if g.kind == "row":
            gpu = layout.gpu_name(g.shape["L"])
            checks, bounds = (f"tflite_L{g.shape['L']}", f"export_L{g.shape['L']}", gpu), ("verify_tflite", "vs_torch")
        else:
            gpu = layout.gpu_name(prefix=g.shape["P"], suffix=g.shape["S"])
            checks, bounds = (g.name, f"export_{g.name}", gpu), ("verify_pair", "vs_row")
        out.append(PlannedGraph(g.name, g.kind, g.shape, g.path, g.signatures, gpu, checks, graph_bounds(p, *bounds)))
    return out
