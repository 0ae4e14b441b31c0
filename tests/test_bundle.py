"""The bundle (scripts/litert/bundle.py, scripts/checks/bundle_check.py): signatures renamed, each constant
stored once, outputs bit-identical to the parts' on the CPU and GPU accelerators; a flipped byte in a shared
weight shows in every signature that reads it; what cannot be bundled is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts.checks import bundle_check
from scripts.litert import bundle, export, gpu_accelerator, tflite_file
from scripts.litert.cpu_graph import CpuGraph
from scripts.pipeline import layout
from scripts.pipeline.errors import ClefError


class Mlp(torch.nn.Module):
    """Two Linear layers: 2 x 128 KiB of weights every length's graph stores as the same bytes."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 512), torch.nn.Linear(512, 64)

    def forward(self, x):
        return {"y": self.down(torch.relu(self.up(x)))}


class TwoSided(torch.nn.Module):
    """A part with two signatures over the same weights, as a pair is."""

    def __init__(self, mlp, squash: bool):
        super().__init__()
        self.mlp, self.squash = mlp, squash

    def forward(self, x):  # (not a scale: the converter would fold it into the last weight)
        y = self.mlp(x)["y"]
        return {"y": torch.tanh(y) if self.squash else y}


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> list[bundle.Part]:
    torch.manual_seed(0)
    mlp = Mlp().eval()
    tmp = tmp_path_factory.mktemp("parts")
    out = []
    for n in (4, 8):
        path = tmp / f"row_L{n}.tflite"
        export.convert(mlp, {"x": torch.randn(1, n, 64)}, path)
        out.append(bundle.Part(path, {"serving_default": f"row_L{n}"}))
    pair = tmp / "pair.tflite"
    export.convert_signatures(
        {
            "prefix": (TwoSided(mlp, False), {"x": torch.randn(1, 8, 64)}),
            "suffix": (TwoSided(mlp, True), {"x": torch.randn(1, 4, 64)}),
        },
        pair,
    )
    out.append(bundle.Part(pair, {"prefix": "prefix_P8_S4", "suffix": "suffix_P8_S4"}))
    return out


@pytest.fixture(scope="module")
def merged(parts, tmp_path_factory) -> tuple[Path, bundle.Merged]:
    path = tmp_path_factory.mktemp("bundle") / "bundle.tflite"
    return path, bundle.merge(parts, path, {"kind": "bundle", "graphs": {"row_L4": {"L": 4}}})


def inputs_of(path: Path, signature: str) -> dict:
    from scripts.litert import litert_c

    shapes = litert_c.signature_shapes(path)[signature]["inputs"]
    g = torch.Generator().manual_seed(1)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def outputs(graph, path: Path, names: dict[str, str]) -> dict:
    """Every signature of a part, run on fixed inputs, through `graph` (opened on the part or the bundle)."""
    from scripts.qwen35.host import litert_signature

    return {
        f"{own}.{k}": v
        for own, name in names.items()
        for k, v in litert_signature(graph.get_signature_runner(name))(**inputs_of(path, name)).items()
    }


def test_the_bundle_holds_every_signature_renamed_and_each_constant_once(parts, merged):
    path, m = merged
    census = tflite_file.census(path)
    assert sorted(census["signatures"]) == sorted(["row_L4", "row_L8", "prefix_P8_S4", "suffix_P8_S4"])
    assert census["subgraphs"] == 4 and tflite_file.violations(census) == []
    one_copy = (64 * 512 + 512 + 512 * 64 + 64) * 4  # the MLP's weights and biases, fp32
    assert m.constant_bytes < 1.05 * one_copy, m  # stored once (a few small constants besides)
    assert m.part_constant_bytes >= 3 * one_copy  # each part held its own copy
    assert m.bytes < 1.2 * max(p.path.stat().st_size for p in parts)
    assert tflite_file.read_metadata(path) == {"kind": "bundle", "graphs": {"row_L4": {"L": 4}}}


def test_the_sharing_record_is_what_the_bundle_stage_writes(merged):
    """Merged is the bundle stage's `sharing` record: its JSON is every field in declaration order, as
    dataclasses.asdict gave it before, and reads back to the same record."""
    import dataclasses

    _, m = merged
    doc = m.to_json()
    assert doc == dataclasses.asdict(m) == m.to_json()
    assert list(doc) == [f.name for f in dataclasses.fields(bundle.Merged)]
    assert bundle.Merged.from_json(json.loads(json.dumps(doc)), "sharing") == m


def test_a_constant_stored_twice_is_found_in_the_file(parts, merged, tmp_path, monkeypatch):
    """The bundle stage's gate on sharing reads the written file back: none in the bundle; a merge whose
    dedup is broken (every buffer given a digest of its own) stores each part's weights again, and the
    gate counts them."""
    path, _ = merged
    assert bundle.duplicate_constants(path) == bundle.Repeats(buffers=0, bytes=0)
    own = iter(range(10**6))
    real = bundle._digest
    monkeypatch.setattr(bundle, "_digest", lambda b, mm: (f"{real(b, mm)[0]}-{next(own)}", real(b, mm)[1]))
    broken = bundle.merge(parts, tmp_path / "broken.tflite", {"kind": "bundle"})
    monkeypatch.undo()
    one_copy = (64 * 512 + 512 + 512 * 64 + 64) * 4
    repeats = bundle.duplicate_constants(tmp_path / "broken.tflite")
    assert repeats.buffers >= 2 * 4 and repeats.bytes >= 2 * one_copy, (repeats, broken)  # 3 parts: 2 more copies


def test_every_signature_is_bit_identical_to_its_file_on_the_cpu_and_the_gpu(parts, merged):
    path, _ = merged
    whole = CpuGraph(path)
    for part in parts:
        own = CpuGraph(part.path)
        diff = bundle_check.difference(
            outputs(whole, path, part.signatures), outputs(own, part.path, {k: k for k in part.signatures})
        )
        assert diff.identical and diff.max_rel == 0.0, (part.path.name, diff)
    for mode in gpu_accelerator.MODES:
        compiled = gpu_accelerator.compile(path, mode)
        assert compiled.fully_accelerated
        for part in parts:
            own = gpu_accelerator.compile(part.path, mode)
            got = {
                f"{k}.{o}": v
                for k, n in part.signatures.items()
                for o, v in compiled.signature(n)(**inputs_of(path, n)).items()
            }
            want = {
                f"{k}.{o}": v for k in part.signatures for o, v in own.signature(k)(**inputs_of(part.path, k)).items()
            }
            own.close()
            assert bundle_check.difference(got, want).identical, (mode, part.path.name)
        compiled.close()


def test_a_flipped_byte_in_a_shared_weight_changes_every_signature_that_reads_it(parts, merged, tmp_path):
    """The identity check can fail: the up-projection's weight is one buffer read by all four signatures."""
    path, _ = merged
    broken = tmp_path / "broken.tflite"
    data = bytearray(path.read_bytes())
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(data, 0)
    largest = max(
        (model.Buffers(i) for i in range(model.BuffersLength())), key=lambda b: b.Size() if b.Offset() > 1 else 0
    )
    data[largest.Offset() + 3] ^= 0x40  # the high byte of the first float: its exponent
    broken.write_bytes(bytes(data))
    whole = CpuGraph(broken)
    for part in parts:
        own = CpuGraph(part.path)
        diff = bundle_check.difference(
            outputs(whole, broken, part.signatures), outputs(own, part.path, {k: k for k in part.signatures})
        )
        assert not diff.identical and diff.max_rel > 1e-3, (part.path.name, diff)


def test_a_truncated_bundle_is_refused_before_it_is_run(merged, tmp_path):
    path, _ = merged
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ClefError, match="truncated or damaged: buffer .* past the file"):
        tflite_file.read_head(cut)


def test_what_cannot_be_bundled_is_refused(parts, tmp_path):
    with pytest.raises(ClefError, match="signatures .'serving_default'., the bundle expects .'other'."):
        bundle.merge([bundle.Part(parts[0].path, {"other": "x"})], tmp_path / "b.tflite", {})
    with pytest.raises(ClefError, match="names clash"):
        bundle.merge(
            [
                bundle.Part(parts[0].path, {"serving_default": "x"}),
                bundle.Part(parts[1].path, {"serving_default": "x"}),
            ],
            tmp_path / "b.tflite",
            {},
        )
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(parts[0].path.read_bytes()))
    model.subgraphs[0].operators[0].builtinOptions = schema.WhileOptionsT()
    with pytest.raises(ClefError, match="names a subgraph; cannot bundle it"):
        bundle._refuse_subgraph_references(model, parts[0].path)
    assert not (tmp_path / "b.tflite").exists()


def test_bundle_signature_names_follow_the_graphs():
    assert layout.bundle_signatures("row", {"L": 64}) == {"serving_default": "row_L64"}
    assert layout.bundle_signatures("pair", {"P": 256, "S": 64}) == {
        "prefix": "prefix_P256_S64",
        "suffix": "suffix_P256_S64",
    }
    graphs = bundle_check.planned([64, 128], [{"prefix": 256, "suffix": 64}])
    names = [n for g in graphs for n in g.signatures.values()]
    assert names == ["row_L64", "row_L128", "prefix_P256_S64", "suffix_P256_S64"]


CRASH = """
import sys
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.hardware_accelerator import HardwareAccelerator
from ai_edge_litert.options import Options
options = Options(hardware_accelerators=HardwareAccelerator.GPU)
options.gpu_options.enforce_f32 = True
options.gpu_options.constant_tensor_sharing = sys.argv[2] == "share"
CompiledModel.from_file(sys.argv[1], options=options)
print("compiled")
"""


class AddOne(torch.nn.Module):
    def forward(self, x):
        return {"y": x + 1.0}


def test_constant_tensor_sharing_crashes_the_gpu_accelerator_on_a_one_op_graph(tmp_path):
    """The smallest graph that shows it: x + 1, compiled for the GPU with the accelerator's
    constant_tensor_sharing option, kills the process (SIGSEGV) on this runtime; without it, it
    compiles. When a runtime fixes it this test fails: then try the option on the bundle (README)."""
    path = tmp_path / "add.tflite"
    export.convert(AddOne(), {"x": torch.randn(1, 2, 8)}, path)
    gpu_accelerator.compile(path, "fp32").close()  # an adapter is there (else one line naming the install)
    runs = {
        how: subprocess.run([sys.executable, "-c", CRASH, str(path), how], capture_output=True, text=True, timeout=300)
        for how in ("plain", "share")
    }
    assert runs["plain"].returncode == 0 and "compiled" in runs["plain"].stdout, runs["plain"].stderr[-2000:]
    assert runs["share"].returncode == -11 and "compiled" not in runs["share"].stdout, (
        runs["share"].returncode,
        runs["share"].stderr[-2000:],
    )
