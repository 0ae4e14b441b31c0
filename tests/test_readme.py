"""scripts/pipeline/readme.py: the README's figure tables come from the pipeline's records and name
the run; a block without records, or of an unknown table, is one line, not a stale table."""

from __future__ import annotations

import pytest

from scripts.pipeline import atomic, layout, readme
from scripts.pipeline.errors import ClefError
from tests.conftest import ROOT

ROWS = {
    "kernel": {
        "passed": True,
        "max_rel": 9.3e-7,
        "max_rel_per_position": 1.4e-5,
        "threshold": 1e-5,
        "threshold_per_position": 1e-4,
        "control_over_threshold": 107148.0,
    },
    "tflite_L64": {
        "L": 64,
        "passed": True,
        "max_rel": 3.0e-6,
        "max_rel_per_position": 7.0e-6,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "bytes": 7626840,
        "op_total": 1456,
        "ops_per_gdn_layer": 169,
        "max_rank": 4,
        "litert_ms": 5.9,
        "torch_over_litert": 3.5,
    },
    "pair_P64_S64": {
        "P": 64,
        "S": 64,
        "passed": False,
        "max_rel": 2e-4,
        "max_rel_per_position": 3e-4,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "bytes": 8647744,
        "max_rel_state": 4.7e-6,
        "op_total": 3087,
        "control_over_threshold": 14249.0,
    },
    "gpu_row_L64": {
        "L": 64,
        "passed": True,
        "fully_accelerated": True,
        "max_rel": 3.9e-6,
        "max_rel_per_position": 9.7e-6,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "fp16_max_rel": 0.032,
        "fp16_floor": 0.0083,
        "fp16_over_floor": 3.8,
    },
    "export_bench": {
        "L": 64,
        "ops_per_gdn_layer": 169,
        "gdn_ops_stock_over_form": 5.5,
        "convert_time_stock_over_form": 5.2,
        "litert_time_stock_over_form": 2.4,
    },
}
README = "intro\n" + "".join(f"<!-- generated: {n} -->\nold\n<!-- end generated: {n} -->\n" for n in readme.TABLES)


@pytest.fixture
def workspace(tmp_path):
    for name, row in ROWS.items():
        atomic.write_json(tmp_path / layout.metrics_path(name), row)
    atomic.write_json(
        tmp_path / layout.RELEASE / "manifest.json", {"git": {"commit": "abcdef0123456789", "clean": True}}
    )
    return tmp_path


def test_tables_carry_the_records_and_name_the_run(workspace):
    text, changed = readme.render(README, workspace)
    assert changed == list(readme.TABLES) and "old" not in text and text.startswith("intro\n")
    assert text.count("From the `dvc repro` at commit abcdef0 (clean)") == len(readme.TABLES)
    assert "| row L=64: LiteRT vs torch | yes | 3.0e-06 | 7.0e-06 | 0.0001, 0.0001 | n/a |" in text
    assert "| pair P=64 S=64: chaining vs row | **no** | 2.0e-04 | 3.0e-04 |" in text  # a failed check shows
    assert "| 64 | 7,626,840 | 1456 | 169 | 4 | 5.9 ms | 3.5x |" in text
    assert readme.render(text, workspace) == (text, [])  # rendering again changes nothing


def test_a_changed_record_changes_the_table(workspace):
    text, _ = readme.render(README, workspace)
    atomic.write_json(workspace / layout.metrics_path("tflite_L64"), {**ROWS["tflite_L64"], "max_rel": 4.0e-6})
    again, changed = readme.render(text, workspace)
    assert "checks" in changed and "| 4.0e-06 |" in again


def test_no_records_or_unknown_block_is_one_line(tmp_path, workspace):
    with pytest.raises(ClefError, match="no metrics under .*run `dvc repro` first"):
        readme.render(README, tmp_path / "empty")
    with pytest.raises(ClefError, match="block `latency` has no table"):
        readme.render("<!-- generated: latency -->\n<!-- end generated: latency -->\n", workspace)


def test_the_readme_has_every_table():
    text = (ROOT / "README.md").read_text()
    found = [m.group("name") for m in readme.BLOCK.finditer(text)]
    assert sorted(found) == sorted(readme.TABLES), found


def test_run_outside_the_repository_is_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "scripts.pipeline.readme"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: no README.md here"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
