"""scripts/release/assemble.py: the manifest's `bundle` entry sums the bundle stage's identity runs per
accelerator, and the manifest keeps the tables every clef command indexes."""

import dataclasses
import json

from scripts.pipeline import layout
from scripts.release import assemble, reader
from scripts.release.entries import HeldFile, StageOutput


def test_the_bundle_entry_sums_identity_per_accelerator(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = {k: k for k in assemble.BUNDLE_FIGURES} | {"gpu_checked": False, "gpu_not_checked_why": "no GPU"}
    doc["identity"] = [
        {"accelerator": "cpu", "identical": True},
        {"accelerator": "cpu", "identical": False},
        {"accelerator": "gpu", "identical": True},
    ]
    layout.result_path("bundle").parent.mkdir(parents=True)
    layout.result_path("bundle").write_text(json.dumps(doc))
    held = HeldFile("bundle/b.tflite", "ab" * 32, "cd" * 16, 10, StageOutput("bundle", None), {})
    entry = assemble.bundle_section(held).to_json()
    assert list(entry) == [
        "file",
        "bytes",
        "sha256",
        *assemble.BUNDLE_FIGURES,
        "identity_vs_own_file",
        "gpu_checked",
        "gpu_not_checked_why",
    ]
    assert entry["identity_vs_own_file"] == {
        "cpu": {"identical": False, "signatures_run": 2},
        "gpu": {"identical": True, "signatures_run": 1},
    }


def test_the_manifest_has_the_tables_clef_reads():
    fields = [f.name for f in dataclasses.fields(assemble.Manifest)]
    assert fields[0] == "format" and set(reader.TABLES) <= set(fields)
