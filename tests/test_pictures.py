"""scripts/pipeline/pictures.py and the README's picture blocks: charts drawn from the records the tables
read, every figure drawn or named, graphs in their order, and a stale picture caught by `readme --check`."""

from __future__ import annotations

import json
import math

import pytest

from scripts.pipeline import atomic, layout, pictures, readme

ROWS = {
    "tflite_L128": {"max_rel": 3e-6, "max_rel_per_position": 7e-6, "threshold": 1e-4},
    "tflite_L64": {"max_rel": 2e-6, "max_rel_per_position": 5e-6, "threshold": 1e-4},
    "pair_P64_S64": {"max_rel": 4e-6, "max_rel_per_position": 9e-6, "threshold": 1e-4},
    "gpu_row_L64": {
        "modes": {"fp16": {"over_floor": 4.2, "over_floor_per_position": 3.6}, "mixed": {"over_floor": 2.1}}
    },
    "kernel": {"max_rel": 1e-6},  # not a graph: not drawn
}


def values(spec: dict) -> list[dict]:
    return spec["data"]["values"]


def test_errors_draws_every_graphs_two_figures_in_length_order():
    spec = pictures.errors(ROWS)
    assert len(values(spec)) == 6 and {d["graph"] for d in values(spec)} == {"L64", "L128", "pair P64 S64"}
    assert spec["layer"][0]["encoding"]["x"]["sort"] == ["L64", "L128", "pair P64 S64"]
    assert "0.0001" in spec["title"] and pictures.svg(spec).startswith("<svg")


def test_gpu_modes_draws_each_mode_and_its_worst_position():
    data = values(pictures.gpu_modes(ROWS))
    assert sorted((d["series"], d["ratio"]) for d in data) == [
        ("fp16", 4.2),
        ("fp16, worst position", 3.6),
        ("mixed", 2.1),
    ]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_figure_that_is_not_finite_is_named_not_dropped_unsaid(bad):
    rows = {**ROWS, "tflite_L64": {**ROWS["tflite_L64"], "max_rel": bad}}
    spec = pictures.errors(rows)
    assert all(math.isfinite(d["error"]) for d in values(spec)) and len(values(spec)) == 5
    assert "1 not finite, not drawn: L64" in spec["title"]


def test_sizes_per_precision():
    weights = {
        "L": 64,
        "source": "tiny",
        "variants": {"fp32": {"bytes": 7_500_000}, "fp16": {"bytes": 4_200_000}},
        "bundle": {"bytes": {"fp32": 9_900_000, "fp16": 6_600_000}},
    }
    spec = pictures.sizes(weights)
    assert len(values(spec)) == 4 and spec["encoding"]["x"]["sort"] == ["fp32", "fp16"]


def test_readme_check_catches_a_stale_picture(tmp_path):
    """A picture block renders its link and its SVG from the records; an SVG that differs is reported."""
    for name, row in ROWS.items():
        atomic.write_json(tmp_path / layout.METRICS / f"{name}.json", row)
    text = "<!-- generated: picture_errors -->\n<!-- end generated: picture_errors -->\n"
    files: dict = {}
    rendered, changed = readme.render(text, tmp_path, files=files)
    assert changed == ["picture_errors"] and "![" in rendered and "results/figures/errors.svg" in rendered
    ((path, drawn),) = files.items()
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(drawn)
    assert readme.render(rendered, tmp_path)[1] == []  # up to date
    (tmp_path / path).write_text(drawn.replace("L64", "L65"))
    assert readme.render(rendered, tmp_path)[1] == ["picture_errors"]
    assert json.loads((tmp_path / layout.METRICS / "tflite_L64.json").read_text())["max_rel"] == 2e-6


def test_the_release_draws_its_own_figures():
    """The card's pictures come from the manifest's figures: each graph's reference record, and the GPU
    modes verify_gpu recorded (none drawn for a release without them)."""
    ref = {"max_rel": 2e-6, "max_rel_per_position": 5e-6, "threshold": 1e-4}
    gpu = {"modes": {"fp16": {"over_floor": 4.2}}}
    pics = pictures.release_pictures({"row_L64": {"reference": ref, "gpu": gpu}, "pair_P64_S64": {"reference": ref}})
    drawn = {p.file: p.svg for p in pics}
    assert sorted(drawn) == ["errors.svg", "gpu_modes.svg"] and all(svg.startswith("<svg") for svg in drawn.values())
    assert "L64" in drawn["errors.svg"] and "pair P64 S64" in drawn["errors.svg"]
    assert [p.file for p in pictures.release_pictures({"row_L64": {"reference": ref}})] == ["errors.svg"]


def artifact(n: int, gpu: bool = True, bad: float | None = None) -> dict:
    """A manifest entry with its curves: the release's CPU run and verify_gpu's modes, n positions."""
    cpu = [1e-6 * (1 + t) for t in range(n)]
    if bad is not None:
        cpu[1] = bad
    entry = {"reference": {"positions": cpu}}
    if gpu:
        entry["gpu"] = {
            "positions": {
                "record": "padded",
                "fp32_vs_torch": [2e-6] * n,
                "fp16_vs_f64": [3e-2] * n,
                "mixed_vs_f64": [1e-2] * n,
                "floor_vs_f64": [8e-3] * n,
            }
        }
    return entry


def test_positions_draws_every_series_at_every_position_of_each_graph():
    spec = pictures.positions({"row_L64": artifact(43), "pair_P64_S64": artifact(64, gpu=False)})
    data = values(spec)
    drawn = {(d["graph"], d["series"]): 0 for d in data}
    for d in data:
        drawn[(d["graph"], d["series"])] += 1
    assert drawn == {
        ("L64", pictures.CPU_SERIES): 43,
        ("L64", "GPU fp32 vs torch"): 43,
        ("L64", "GPU fp16 vs float64"): 43,
        ("L64", "GPU mixed vs float64"): 43,
        ("L64", pictures.FLOOR_SERIES): 43,
        ("pair P64 S64", pictures.CPU_SERIES): 64,
    }
    assert spec["facet"]["sort"] == ["L64", "pair P64 S64"] and pictures.svg(spec).startswith("<svg")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_position_that_is_not_finite_is_named(bad):
    spec = pictures.positions({"row_L64": artifact(5, bad=bad)})
    assert "1 not finite, not drawn: L64" in spec["title"] and len(values(spec)) == 5 * 5 - 1


def test_the_release_draws_positions_only_where_it_has_curves():
    ref = {"max_rel": 2e-6, "max_rel_per_position": 5e-6, "threshold": 1e-4}
    with_curves = {"row_L64": {**artifact(8), "reference": {**ref, "positions": [1e-6] * 8}}}
    assert "positions.svg" in [p.file for p in pictures.release_pictures(with_curves)]
    assert "positions.svg" not in [p.file for p in pictures.release_pictures({"row_L64": {"reference": ref}})]
