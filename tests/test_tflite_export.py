"""Export to LiteRT: the census catches what delegates reject, metadata survives a round trip,
and bad requests are refused before any conversion, leaving nothing behind."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from scripts import clef_kernel, export, tflite_file
from scripts.errors import ClefError
from tests.conftest import assert_one_line_error


class Clean(torch.nn.Module):
    def forward(self, x):
        return {"y": torch.relu(x @ x.transpose(1, 2)) * 2.0}


class Rejected(torch.nn.Module):
    def forward(self, x):
        five = x.reshape(1, 2, 2, 2, 4).sum(-1)  # a rank-5 value
        return {"y": torch.cumsum(x, dim=1) + five.reshape(1, 8).sum()}


@pytest.fixture(scope="module")
def clean_model() -> bytes:
    return export.convert(Clean(), {"x": torch.randn(1, 4, 8)})


def test_census_of_a_clean_model(clean_model):
    c = tflite_file.census(clean_model)
    assert c["max_rank"] == 3 and c["op_total"] >= 2 and tflite_file.violations(c) == []
    assert c["signatures"]["serving_default"]["inputs"] == [{"name": "x", "shape": [1, 4, 8], "dtype": "float32"}]


def test_census_flags_rank5_and_cumsum():
    c = tflite_file.census(export.convert(Rejected(), {"x": torch.randn(1, 4, 8)}))
    found = tflite_file.violations(c)
    assert any("rank 5" in v for v in found) and any("CUMSUM" in v for v in found), (found, c["ops"])


def test_metadata_round_trip_keeps_the_model_working(clean_model, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    meta = {"revision": "0" * 40, "form": "R64+sp+ec+dd+vs6", "L": 4}
    once = tflite_file.with_metadata(clean_model, meta)
    twice = tflite_file.with_metadata(once, {**meta, "L": 5})
    assert tflite_file.read_metadata(once) == meta and tflite_file.read_metadata(twice)["L"] == 5
    assert tflite_file.read_metadata(clean_model) is None
    assert tflite_file.with_metadata(clean_model, meta) == once  # deterministic bytes
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    outs = []
    for content in (clean_model, twice):
        path = tmp_path / f"m{len(outs)}.tflite"
        path.write_bytes(content)
        outs.append(Interpreter(model_path=str(path)).get_signature_runner()(x=x)["y"])
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("form, length, fragment", [
    ("R64+sp+ec+dd+vs6", 0, "L=0 is not a positive integer"),
    ("R64+sp+ec+dd+vs6", -64, "L=-64 is not a positive integer"),
    ("R64+sp+ec+dd+vs6", 5000, "above the model's max_position_embeddings (4096)"),
    ("loop+dd", 64, "loop inverse"),
    ("R64+sp+ec+vs6", 64, "CUMSUM"),
])
def test_check_exportable(form, length, fragment):
    with pytest.raises(ClefError) as info:
        export.check_exportable(clef_kernel.parse(form), length, 4096)
    assert fragment in str(info.value)


@pytest.mark.parametrize("length, fragment", [("0", "L=0"), ("100000", "max_position_embeddings")])
def test_export_stage_refuses_bad_length_before_converting(workdir, length, fragment):
    import subprocess

    from tests.conftest import ROOT

    proc = subprocess.run([sys.executable, "-m", "stages.export", "--length", length], cwd=workdir,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert_one_line_error(proc, fragment)
    assert not (workdir / "artifacts").exists()


def test_failed_conversion_leaves_no_tflite(workdir, monkeypatch):
    from stages import export as export_stage

    def broken(module, sample_kwargs):
        raise RuntimeError("conversion died midway")

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(export, "convert", broken)
    monkeypatch.setattr(sys, "argv", ["export", "--length", "64"])
    with pytest.raises(RuntimeError, match="midway"):
        export_stage.main()
    assert not list(workdir.rglob("*.tflite")) and not list(workdir.rglob("*.partial"))
