"""make real-width's pieces that can be checked without a real-width run: the params override is
valid for every stage, and the clef-flash extrapolation scales what grows with the layer count."""

from __future__ import annotations

import yaml

from scripts.bench import real_width, report
from scripts.pipeline import params
from tests.conftest import ROOT


def test_override_is_valid_params_for_every_section(tmp_path):
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = real_width.overridden(base)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    checked = params.load(list(p), path=tmp_path / "params.yaml")
    assert checked["model"]["source"] == "synthetic" and checked["lengths"] == [64]
    assert checked["pairs"] == [{"prefix": 64, "suffix": 64}]
    # everything else is the committed params: the same form and thresholds as the tiny run
    assert {k: v for k, v in checked.items() if k not in ("model", "lengths", "pairs")} == {
        k: v for k, v in base.items() if k not in ("model", "lengths", "pairs")
    }
    assert {k: v for k, v in checked["model"].items() if k != "source"} == {
        k: v for k, v in base["model"].items() if k != "source"
    }


def test_extrapolation_scales_what_grows_with_the_weights():
    def ws(layers, stages, graph_bytes):
        return {
            "layers": layers,
            "fp32_bytes": layers * 1e9,
            "stages": stages,
            "latency": {"64": {"bytes": graph_bytes}},
        }

    tiny = ws(
        8,
        {"export@64": {"seconds": 10.0, "peak_rss_gib": 1.0}, "verify_kernel": {"seconds": 60.0, "peak_rss_gib": 0.5}},
        7e6,
    )
    real = ws(
        4,
        {"export@64": {"seconds": 30.0, "peak_rss_gib": 4.5}, "verify_kernel": {"seconds": 55.0, "peak_rss_gib": 0.5}},
        3.5e9,
    )
    tiny["stages"]["export@64"]["peak_anon_gib"], real["stages"]["export@64"]["peak_anon_gib"] = 0.5, 2.0
    out = report.extrapolate(tiny, real)
    assert out["blocks"] == 8
    assert out["stages"]["export@64"] == {
        "seconds": 8 * 30.0,
        "peak_rss_gib": 1.0 + 8 * 3.5,
        "peak_anon_gib": 0.5 + 8 * 1.5,
    }
    assert out["stages"]["verify_kernel"] == {"seconds": 55.0, "peak_rss_gib": 0.5}  # set by widths, not layers
    assert out["row_graph_bytes_per_L"] == 8 * 3.5e9 and out["fp32_stack_bytes"] == 8 * 4e9
