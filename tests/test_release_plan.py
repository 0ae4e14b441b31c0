"""scripts/release/plan.py: the graphs a release ships, each with the checks that vouch for it and the
bounds its verify stage held it to."""

from scripts.pipeline import layout
from scripts.release import plan

PARAMS = {
    "lengths": [64, 128],
    "pairs": [{"prefix": 64, "suffix": 32}],
    "verify_tflite": {"max_rel_vs_torch": 1e-4, "max_rel_per_position_vs_torch": 2e-4},
    "verify_pair": {"max_rel_vs_row": 3e-4, "max_rel_per_position_vs_row": 4e-4},
}


def test_rows_then_pairs_each_with_its_checks_and_its_verify_stages_bounds():
    rows, pair = plan.planned(PARAMS)[:2], plan.planned(PARAMS)[2]
    assert [g.name for g in rows] == [layout.row_name(64), layout.row_name(128)]
    assert rows[0].checks == ("tflite_L64", "export_L64", layout.gpu_name(64))
    assert rows[0].bounds == plan.Bounds(1e-4, 2e-4)
    assert pair.kind == "pair" and pair.shape == {"P": 64, "S": 32}
    assert pair.checks == (pair.name, f"export_{pair.name}", layout.gpu_name(prefix=64, suffix=32))
    assert pair.gpu == layout.gpu_name(prefix=64, suffix=32) and pair.bounds == plan.Bounds(3e-4, 4e-4)
