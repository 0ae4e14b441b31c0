"""scripts/release/entries.py: the manifest's `gpu` entry keeps verify_gpu's figures in their order (a
refused graph its two keys), and a GPU record missing a figure is one line naming the file."""

import dataclasses
import json

import pytest

from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError
from scripts.release import entries

FIGURES = [f.name for f in dataclasses.fields(entries.GpuFigures)]


def write_gpu(name: str, doc: dict) -> None:
    path = layout.gpu_result_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_the_gpu_entry_is_verify_gpus_figures_in_their_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_gpu("gpu_row_L64", {"kind": "row", **{k: i for i, k in enumerate(reversed(FIGURES))}, "passed": True})
    entry = entries.gpu_section("gpu_row_L64").to_json()
    assert list(entry) == FIGURES and entry["device"] == 1
    assert FIGURES[:3] == ["fully_accelerated", "layers_checked", "layers"] and FIGURES[-2:] == ["device", "decision"]
    write_gpu("gpu_row_L64", {"kind": "row", **{k: 0 for k in FIGURES if k != "decision"}, "passed": True})
    assert "decision" not in entries.gpu_section("gpu_row_L64").to_json()  # a record from before it, or synthetic


def test_a_refused_graph_keeps_its_two_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_gpu("gpu_row_L64", {"refused": "int8 weights", "fully_accelerated": None})
    assert entries.gpu_section("gpu_row_L64").to_json() == {"fully_accelerated": False, "refused": "int8 weights"}


def test_a_gpu_record_missing_a_figure_is_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_gpu("gpu_row_L64", {k: 0 for k in FIGURES if k != "modes"})
    with pytest.raises(ClefError, match=r"results/gpu/gpu_row_L64.json: no `modes` in the GpuFigures record"):
        entries.gpu_section("gpu_row_L64")
