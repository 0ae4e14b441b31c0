"""The fetch stage and params checks: the tiny default, and bad params refused before anything is written."""

from __future__ import annotations

import fnmatch
import json

import pytest
import yaml

from scripts.checkpoint import fetch, snapshot
from scripts.pipeline import params
from scripts.pipeline.errors import ClefError
from tests.conftest import ROOT, assert_one_line_error, run_stage

GOOD = {"source": "tiny", "repo": "Cloudflare/clef-flash", "revision": "f0b7d3cd65296abfe459e6c228b618f5d8b26d2f"}


def write_params(workdir, **model):
    memory = yaml.safe_load((ROOT / "params.yaml").read_text())["memory"]  # every stage's budget
    (workdir / "params.yaml").write_text(yaml.safe_dump({"model": {**GOOD, **model}, "memory": memory}))


def assert_nothing_written(workdir):
    assert sorted(p.name for p in workdir.iterdir()) == ["params.yaml"]


def test_tiny_fetch_writes_snapshot_and_record(tmp_path, tiny_cache):
    write_params(tmp_path)
    proc = run_stage("fetch", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = snapshot.load_record(tmp_path / "results" / "snapshot.json")
    assert rec == tiny_cache[1]
    assert snapshot.verify(rec, root=tmp_path).is_dir()
    assert not (tmp_path / "hf.partial").exists()
    runtime = json.loads((tmp_path / "results" / "runtime" / "fetch.json").read_text())  # every stage leaves one
    assert runtime["stage"] == "fetch" and runtime["seconds"] > 0 and runtime["peak_rss_bytes"] > 2**20
    assert 0 < runtime["startup_seconds"] < runtime["seconds"]  # its imports: what the bench does not scale


@pytest.mark.parametrize(
    "model, fragments",
    [
        ({"source": "local"}, ["model.source 'local' is not one of", "tiny, synthetic, hub"]),
        ({"revision": "main"}, ["model.revision 'main'", "40-hex"]),
        ({"revision": "f0b7d3cd"}, ["model.revision 'f0b7d3cd'", "40-hex"]),
        ({"revision": "F0B7D3CD65296ABFE459E6C228B618F5D8B26D2F"}, ["40-hex"]),
        ({"repo": "clef-flash"}, ["model.repo 'clef-flash'"]),
    ],
)
def test_bad_model_params_refused_before_any_work(tmp_path, model, fragments):
    write_params(tmp_path, **model)
    assert_one_line_error(run_stage("fetch", tmp_path), *fragments)
    assert_nothing_written(tmp_path)


def test_missing_params_file(tmp_path):
    assert_one_line_error(run_stage("fetch", tmp_path), "params.yaml")
    assert list(tmp_path.iterdir()) == []


def test_params_missing_section(tmp_path):
    (tmp_path / "params.yaml").write_text("form: R64\n")
    with pytest.raises(ClefError, match="missing section `model`"):
        params.load(["model"], tmp_path / "params.yaml")


def test_hub_download_asks_for_no_pickles():
    for name in ("pytorch_model.bin", "model.pt", "consolidated.pth", "optimizer.pkl"):
        assert not any(fnmatch.fnmatch(name, p) for p in fetch.HUB_PATTERNS), name
    for name in ("model-00001-of-00004.safetensors", "model.safetensors.index.json", "config.json", "tokenizer.json"):
        assert any(fnmatch.fnmatch(name, p) for p in fetch.HUB_PATTERNS), name


def test_hub_source_unreachable_is_one_line_and_writes_nothing(tmp_path):
    """No hub answers (a closed loopback port): a clear error, no hf/ and no record."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    write_params(tmp_path, source="hub")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "stages.fetch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert_one_line_error(proc, "download of Cloudflare/clef-flash@f0b7d3cd65296abfe459e6c228b618f5d8b26d2f failed")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "results").exists()
