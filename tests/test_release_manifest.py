"""scripts/release/manifest.py: the manifest's records need no torch, a graph's entry keeps the key
order artifact_entry always wrote, and a manifest missing a field is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.pipeline import atomic
from scripts.pipeline.errors import ClefError
from scripts.release import reader
from scripts.release.builder import SignatureTensor, SignatureTensors
from scripts.release.manifest import ArtifactEntry, GpuRefused, Reference, StageOutput
from tests.test_release import small_release


def test_the_manifest_records_import_no_torch():
    code = "import sys, scripts.release.manifest; assert 'torch' not in sys.modules, 'torch'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def entry(**shape) -> ArtifactEntry:
    io_ = [SignatureTensor("embeds", [1, 64, 8], "float32", "embeddings")]
    return ArtifactEntry(
        kind="pair" if "P" in shape else "row",
        **shape,
        form="R64",
        weights="fp32",
        file="bundle/b.tflite",
        signature_names={"prefix": "prefix_P64_S64"},
        sha256="0" * 64,
        bytes=10,
        md5="1" * 32,
        dvc_lock=StageOutput("bundle", None),
        signatures={"prefix": SignatureTensors(io_, io_)},
        census={"op_total": 1},
        metadata={"kind": "pair"},
        contract={"version": 2},
        verification={"chain": {"max_rel": 1e-6}},
        gpu=GpuRefused(False, "int8 weights"),
        reference=Reference("checks/p.safetensors", 1e-6, 1e-4, 2e-6, 1e-4, 10, [1e-6]),
    )


@pytest.mark.parametrize("shape, keys", [({"L": 64}, ["L"]), ({"P": 64, "S": 32}, ["P", "S"])])
def test_a_graphs_entry_keeps_its_key_order_and_round_trips(shape, keys):
    doc = json.loads(json.dumps(entry(**shape).to_json()))
    rest = ["form", "weights", "file", "signature_names", "sha256", "bytes", "md5", "dvc_lock", "signatures"]
    assert list(doc) == ["kind", *keys, *rest, "census", "metadata", "contract", "verification", "gpu", "reference"]
    back = ArtifactEntry.from_json(doc, "m")
    assert back == entry(**shape) and isinstance(back.gpu, GpuRefused)


def test_load_manifest_refuses_a_manifest_missing_a_field_naming_the_file(tmp_path):
    doc = small_release(tmp_path).to_json()
    assert reader.load_manifest(tmp_path).to_json() == doc
    del doc["model"]
    atomic.write_json(tmp_path / reader.MANIFEST, doc)
    with pytest.raises(ClefError, match=rf"^{tmp_path / reader.MANIFEST}: no `model` in the Manifest record"):
        reader.load_manifest(tmp_path)
