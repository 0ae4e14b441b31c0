"""Export to LiteRT: the census catches what delegates reject, metadata survives a round trip,
and bad requests are refused before any conversion, leaving nothing behind."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from scripts.layers import gated_delta
from scripts.litert import export, tflite_file
from scripts.pipeline.errors import ClefError
from tests.conftest import assert_one_line_error


class Clean(torch.nn.Module):
    def forward(self, x):
        return {"y": torch.relu(x @ x.transpose(1, 2)) * 2.0}


class Rejected(torch.nn.Module):
    def forward(self, x):
        five = x.reshape(1, 2, 2, 2, 4).sum(-1)  # a rank-5 value
        return {"y": torch.cumsum(x, dim=1) + five.reshape(1, 8).sum()}


def convert_bytes(module, sample, tmp) -> bytes:
    path = tmp / "converted.tflite"
    export.convert(module, sample, path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def clean_model(tmp_path_factory) -> bytes:
    return convert_bytes(Clean(), {"x": torch.randn(1, 4, 8)}, tmp_path_factory.mktemp("clean"))


def externalized(content: bytes) -> bytes:
    """The same model in the >2 GB layout: every buffer's data moved after the flatbuffer head, at
    an absolute, 64-byte-aligned offset (what the converter writes for a model over the limit)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    blobs = []
    for buf in model.buffers:
        if buf.data is not None and len(buf.data):
            blobs.append((buf, bytes(bytearray(buf.data))))
            buf.data, buf.offset, buf.size = None, 2, 1  # placeholders: fixed-width fields, final below
    head = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    pos, tail = -(-len(head) // 64) * 64 + 64, b""  # + 64: the data does not start right at the head
    start = pos
    for buf, data in blobs:
        buf.offset, buf.size = pos, len(data)
        tail += data + bytes(-(-len(data) // 64) * 64 - len(data))
        pos += -(-len(data) // 64) * 64
    head = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    assert len(head) <= start and schema.Model.GetRootAs(head, 0).BuffersLength() == len(model.buffers)
    return head + bytes(start - len(head)) + tail


def test_census_of_a_clean_model(clean_model):
    c = tflite_file.census(clean_model)
    assert c["max_rank"] == 3 and c["op_total"] >= 2 and tflite_file.violations(c) == []
    assert c["signatures"]["serving_default"]["inputs"] == [{"name": "x", "shape": [1, 4, 8], "dtype": "float32"}]


def test_matmul_flops_counted_from_shapes(clean_model):
    # y = relu(x @ x^T) * 2, x [1, 4, 8]: one [4, 8] x [8, 4] product, 2 x 4 x 4 x 8 FLOPs (the
    # converter may lower it to FULLY_CONNECTED or BATCH_MATMUL)
    flops = tflite_file.matmul_flops(clean_model)
    assert sum(flops.values()) == 256 and set(flops) <= {"FULLY_CONNECTED", "BATCH_MATMUL"}, flops


def test_census_flags_rank5_and_cumsum(tmp_path):
    c = tflite_file.census(convert_bytes(Rejected(), {"x": torch.randn(1, 4, 8)}, tmp_path))
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


def test_metadata_of_a_model_with_external_buffers(clean_model, tmp_path):
    """The >2 GB layout: the metadata goes into the head, the data is shifted whole, the offsets with
    it, and the model computes the same; only the head is read back."""
    from ai_edge_litert.interpreter import Interpreter

    src = tmp_path / "external.tflite"
    src.write_bytes(externalized(clean_model))
    start = tflite_file.DATA_ALIGN * 2  # enough to see that read_head stops before the data
    assert len(tflite_file.read_head(src)) < src.stat().st_size - start
    meta = {"revision": "1" * 40, "form": "R64+sp+ec+dd+vs6", "L": 4, "note": "x" * 300}  # a head that grows
    out = tmp_path / "with_meta.tflite"
    size = tflite_file.write_with_metadata(src, out, meta)
    assert size == out.stat().st_size > src.stat().st_size
    assert tflite_file.read_metadata(out) == meta and tflite_file.read_metadata(src) is None
    assert tflite_file.census(out)["ops"] == tflite_file.census(clean_model)["ops"]
    again = tmp_path / "again.tflite"
    tflite_file.write_with_metadata(out, again, {**meta, "L": 5})  # replaced, not added
    assert tflite_file.read_metadata(again)["L"] == 5
    x = np.random.default_rng(1).standard_normal((1, 4, 8)).astype(np.float32)
    small = tmp_path / "small.tflite"
    small.write_bytes(clean_model)
    outs = [Interpreter(model_path=str(p)).get_signature_runner()(x=x)["y"] for p in (small, src, out, again)]
    for y in outs[1:]:
        assert np.array_equal(outs[0], y)
    with pytest.raises(ValueError, match="external buffers"):
        tflite_file.with_metadata(src.read_bytes(), meta)


def test_the_data_shifted_in_place_is_the_data_copied(clean_model, tmp_path, monkeypatch):
    """export.write hands its scratch file over to be shifted in place (fallocate INSERT_RANGE) and
    renamed; where the filesystem cannot, the copy stands in. Both give the same bytes, and use the
    scratch file up. Broken once: a shift that is not a whole block is refused, the file untouched."""
    from ai_edge_litert.interpreter import Interpreter

    data = externalized(clean_model)
    probe = tmp_path / "probe"
    probe.write_bytes(data)
    assert not tflite_file.shift_in_place(probe, tflite_file.DATA_ALIGN, b"x"), "a 64-byte shift is not a block"
    assert probe.read_bytes() == data
    assert tflite_file.shift_in_place(probe, tflite_file.HEAD_ROOM, b"head"), (
        f"fallocate INSERT_RANGE is refused on {tmp_path}'s filesystem: the in-place path cannot be tested here"
    )
    assert probe.read_bytes() == b"head" + bytes(tflite_file.HEAD_ROOM - 4) + data
    meta = {"revision": "2" * 40, "L": 4}
    outs, shifted, real = {}, [], tflite_file.shift_in_place
    for how, fake in (("in place", lambda *a: shifted.append(real(*a)) or shifted[-1]), ("copied", lambda *a: False)):
        monkeypatch.setattr(tflite_file, "shift_in_place", fake)
        raw, outs[how] = tmp_path / f"{how}.raw", tmp_path / f"{how}.tflite"
        raw.write_bytes(data)
        tflite_file.write_with_metadata(raw, outs[how], meta, consume=True)
        assert not raw.exists()
    assert shifted == [True]
    kept = tmp_path / "kept.raw"
    kept.write_bytes(data)
    tflite_file.write_with_metadata(kept, tmp_path / "kept.tflite", meta)
    assert kept.read_bytes() == data
    assert outs["in place"].read_bytes() == outs["copied"].read_bytes() == (tmp_path / "kept.tflite").read_bytes()
    assert tflite_file.read_metadata(outs["in place"]) == meta
    x = np.random.default_rng(2).standard_normal((1, 4, 8)).astype(np.float32)
    small = tmp_path / "small.tflite"
    small.write_bytes(clean_model)
    ys = [Interpreter(model_path=str(f)).get_signature_runner()(x=x)["y"] for f in (small, outs["in place"])]
    assert np.array_equal(*ys)


@pytest.mark.parametrize(
    "form, length, fragment",
    [
        ("R64+sp+ec+dd+vs6", 0, "L=0 is not a positive integer"),
        ("R64+sp+ec+dd+vs6", -64, "L=-64 is not a positive integer"),
        ("R64+sp+ec+dd+vs6", 5000, "above the model's max_position_embeddings (4096)"),
        ("loop+dd", 64, "loop inverse"),
        ("R64+sp+ec+vs6", 64, "CUMSUM"),
    ],
)
def test_check_exportable(form, length, fragment):
    with pytest.raises(ClefError) as info:
        export.check_exportable(gated_delta.parse(form), length, 4096)
    assert fragment in str(info.value)


@pytest.mark.parametrize("length, fragment", [("0", "L=0"), ("100000", "max_position_embeddings")])
def test_export_stage_refuses_bad_length_before_converting(workdir, length, fragment):
    import subprocess

    from tests.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "stages.export", "--length", length],
        cwd=workdir,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert_one_line_error(proc, fragment)
    assert not (workdir / "artifacts").exists()


def test_failed_conversion_leaves_no_tflite(workdir, monkeypatch):
    from stages import export as export_stage

    def broken(module, sample_kwargs, path):
        raise RuntimeError("conversion died midway")

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(export, "convert", broken)
    monkeypatch.setattr(sys, "argv", ["export", "--length", "64"])
    with pytest.raises(RuntimeError, match="midway"):
        export_stage.main()
    assert not list(workdir.rglob("*.tflite")) and not list(workdir.rglob("*.partial"))


def test_metadata_mismatches_names_each_key_that_differs():
    """The one identity check of a graph (verify_tflite, verify_pair, the release, clef verify and audit)."""
    meta = {"revision": "a" * 40, "form": "R64+dd", "kind": "row", "L": 64}
    assert tflite_file.metadata_mismatches(meta, {"form": "R64+dd", "L": 64}) == []
    assert tflite_file.metadata_mismatches(meta, {"form": "R32+dd", "L": 64, "P": 8}) == [
        "form is 'R64+dd', expected 'R32+dd'",
        "P is None, expected 8",
    ]
    assert tflite_file.metadata_mismatches(None, {"L": 64}) == [f"no {tflite_file.METADATA_NAME} metadata entry"]


def test_a_converted_model_is_freed_with_its_last_reference(tmp_path):
    """After export.convert nothing holds the model's weights: a stage that converts and then frees the
    stack before loading the interpreter really frees it (torch.export keeps its last trace, and with it
    every parameter, in a module-level map unless export.release_export_trace drops it)."""
    import gc
    import weakref

    module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    class Graph(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return {"y": self.inner(x)}

    weight = weakref.ref(module[0].weight)
    export.convert(Graph(module), {"x": torch.randn(1, 16)}, tmp_path / "small.tflite")
    del module
    gc.collect()
    assert weight() is None


def test_the_content_digest_leaves_out_the_metadata_and_nothing_else(clean_model, tmp_path):
    """Two exports of one graph at different commits have the same content digest; one changed weight
    byte, inline or in the >2 GB layout's external data, changes it (what `scripts.litert.digests`
    compares before and after a refactor)."""
    meta = {"revision": "1" * 40, "git": {"commit": "a" * 40}}
    paths = {}
    for name, content in (
        ("a", tflite_file.with_metadata(clean_model, meta)),
        ("b", tflite_file.with_metadata(clean_model, {**meta, "git": {"commit": "b" * 40}})),
    ):
        paths[name] = tmp_path / f"{name}.tflite"
        paths[name].write_bytes(content)
    digest = tflite_file.content_digest
    assert paths["a"].read_bytes() != paths["b"].read_bytes()
    assert digest(paths["a"]) == digest(paths["b"])
    ext = tmp_path / "ext.tflite"
    ext.write_bytes(externalized(clean_model))
    short, long = tmp_path / "short.tflite", tmp_path / "long.tflite"
    tflite_file.write_with_metadata(ext, short, meta)
    tflite_file.write_with_metadata(ext, long, {**meta, "note": "x" * 5000})  # the data moves further
    assert tflite_file.read_head(short) != tflite_file.read_head(long)
    assert digest(short) == digest(long)
    for path, at in ((paths["a"], -100), (short, tflite_file._data_start(short.read_bytes()))):
        data = bytearray(path.read_bytes())
        data[at] ^= 1  # a byte of a buffer's data: inline near the end, or the first external buffer's
        broken = tmp_path / f"broken_{path.name}"
        broken.write_bytes(bytes(data))
        assert digest(broken) != digest(path)


def test_a_graphs_metadata_keeps_the_keys_and_order_it_had():
    """The metadata is a record; what a graph embeds has the keys of the dict it replaced, in its
    order: a row's L, or a pair's P and S, right after its kind, and the git state last."""
    from scripts.checkpoint.snapshot import SnapshotRecord
    from scripts.qwen35.row_graph import RowContract

    rec = SnapshotRecord("tiny", "org/model", "r" * 40, "hf/snapshot", [])
    contract = RowContract("row", 2, 4, "R64", [], [], "mask", "guard", "none")
    head = ["repo", "revision", "source", "form", "weights", "kind"]
    tail = ["contract_version", "contract", "params", "versions", "git"]
    for shape, keys in (({"kind": "row", "L": 4}, ["L"]), ({"kind": "pair", "P": 8, "S": 4}, ["P", "S"])):
        doc = export.metadata(rec, "R64", "fp16", contract, shape, {"form": "R64"}).to_json()
        assert list(doc) == head + keys + tail
        assert doc["contract"] == contract.to_json() and doc["contract_version"] == 2 and doc["kind"] == shape["kind"]
        assert list(doc["git"]) == ["commit", "clean", "changed"]
