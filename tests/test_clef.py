"""The `clef` command on the release the session's pipeline built: `verify` (directory and tarball,
with and without torch, with a key, `--json`), `audit` and `run`, each refusing bad input and every
tampering in one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts.checkpoint import snapshot
from scripts.pipeline import atomic, layout, params
from scripts.release import builder, reader
from tests.conftest import ROW, assert_one_line_error, clef, clef_without_torch, graph_file, tool_env, tree


def test_clef_verify_passes_on_the_release(built):
    proc = clef(built.parent, "verify", str(built))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = reader.load_manifest(built)
    for path in manifest.artifacts:
        assert f"ok   {path}" in proc.stdout
    assert "all checks passed" in proc.stdout and f"[{len(manifest.artifacts)}/" in proc.stderr  # progress


def test_clef_verify_json_reports_each_graphs_figures(built):
    """`--json`: one JSON document on stdout, every graph's figures beside the release's, the lines on stderr."""
    proc = clef(built.parent, "verify", str(built), "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    manifest = reader.load_manifest(built)
    assert doc["passed"] is True and doc["problems"] == [] and doc["name"] == manifest.name
    assert doc["clef"].startswith("clef-litert ") and doc["signature"]["state"] in ("unsigned", "not checked")
    assert set(doc["graphs"]) == set(manifest.artifacts)
    for name, g in doc["graphs"].items():
        ref = manifest.artifacts[name].reference
        assert g["passed"] and g["release_max_rel"] == ref.max_rel and g["max_rel"] <= g["threshold"], name
        assert f"ok   {name}: max rel {g['max_rel']:.2e}" in proc.stderr
    assert "all checks passed" in doc["summary"]


def test_clef_verify_json_keeps_a_nan_figure():
    from scripts.clef.commands import _finite_json

    assert json.loads(json.dumps(_finite_json({"a": [float("nan"), 1.0], "b": float("inf")}))) == {
        "a": ["nan", 1.0],
        "b": "inf",
    }


def test_clef_verify_json_writes_each_graphs_verdict_and_its_gpu_modes_after_it(capsys):
    """`--json`'s graphs: the interpreter's figures and bounds, then (--gpu) each mode in the order run;
    a graph not run on the GPU has no `gpu` key."""
    from scripts.clef.commands import GpuVerdict, GraphVerdict, Report

    report = Report(as_json=True)
    for name in ("row_L64", "pair_P64_S64"):
        report.graphs[name] = GraphVerdict("bundle/b.tflite", 1e-6, 2e-6, 1e-6, 2e-6, 1e-4, None, True)
    for mode in ("fp32", "fp16"):
        report.gpu("row_L64", mode, GpuVerdict(float("nan"), 1e-3, "a GPU", True, False))
    assert report.finish(["row_L64: GPU fp16"], "1 problem") == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["signature", "graphs", "passed", "problems", "summary"]
    row, pair = doc["graphs"]["row_L64"], doc["graphs"]["pair_P64_S64"]
    assert list(row) == [*pair, "gpu"] and list(pair)[-1] == "passed" and pair["threshold_per_position"] is None
    assert list(row["gpu"]) == ["fp32", "fp16"] and row["gpu"]["fp16"]["max_rel"] == "nan"


def test_clef_verify_takes_the_tarball_a_device_team_receives(built, tmp_path):
    """The release's .tar.zst, unpacked beside itself, verified as the directory is, then removed: in a
    device team's venv, with torch, transformers and litert-torch unimportable (the records run as numpy
    arrays, the figures through the same error metric). Only --gpu asks for torch, in one line."""
    manifest = reader.load_manifest(built)
    shutil.copy(built.parent / "dist" / (manifest.name + builder.TARBALL_SUFFIX), tmp_path)
    (received,) = tmp_path.iterdir()
    proc = clef_without_torch(tmp_path, "verify", str(received))
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert all(f"ok   {name}" in proc.stdout for name in manifest.artifacts)
    with_torch = clef(tmp_path, "verify", str(received))
    assert with_torch.returncode == 0
    assert [line for line in proc.stdout.splitlines() if line.startswith("ok")] == [
        line for line in with_torch.stdout.splitlines() if line.startswith("ok")
    ], "the figures without torch are the figures with it"
    assert list(tmp_path.iterdir()) == [received]
    assert_one_line_error(clef_without_torch(tmp_path, "verify", str(received), "--gpu"), "--gpu needs torch")
    assert list(tmp_path.iterdir()) == [received]


def test_manifest_records_the_gpu_figures_and_clef_verify_gpu_reruns_them(built):
    manifest = reader.load_manifest(built)
    for path, art in manifest.artifacts.items():
        g = art.gpu
        assert g.fully_accelerated and g.all_finite and g.device["adapter"], path
        assert g.fp32_max_rel_vs_torch <= g.threshold_fp32 and g.floor_max_rel_vs_f64 > 0, path
        assert g.modes["mixed"]["probe"]["arithmetic"] == "mixed" and g.modes["mixed"]["fully_accelerated"], path
    card = (built / "README.md").read_text()
    assert "kLiteRtDelegatePrecisionFp16WithFp32Accum" in card and "mixed vs float64" in card
    proc = clef(built.parent, "verify", "--gpu", str(built))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for path in manifest.artifacts:
        for mode in ("fp32", "fp16", "mixed"):
            assert re.search(rf"ok   {re.escape(path)}: GPU {mode} on .+: max rel", proc.stdout), (
                path,
                mode,
                proc.stdout,
            )
    assert "DestroyAccelerator" not in proc.stderr, "the runtime's teardown log leaks after clef's output"


@pytest.mark.parametrize(
    "tamper, named",
    [
        ("byte", "changed file: GRAPH"),
        ("missing", "missing file: checks/pair_P64_S64.safetensors"),
        ("extra", "extra file: host/notes.txt"),
    ],
)
def test_clef_verify_names_a_tampered_file(release_copy, tamper, named):
    named = named.replace("GRAPH", graph_file(release_copy))
    if tamper == "byte":
        f = release_copy / graph_file(release_copy)
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    elif tamper == "missing":
        (release_copy / "checks" / "pair_P64_S64.safetensors").unlink()
    else:
        (release_copy / "host" / "notes.txt").write_text("not part of the release")
    proc = clef(release_copy.parent, "verify", str(release_copy))
    assert proc.returncode == 1 and f"FAIL {named}" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "where, path, named",
    [
        ("artifact", "/abs/row_L64.tflite", "manifest graph path '/abs/row_L64.tflite' is absolute"),
        ("artifact", "../elsewhere/row_L64.tflite", "climbs out with '..'"),
        (
            "reference",
            "../other/checks/row_L64.safetensors",
            "manifest reference record path '../other/checks/row_L64.safetensors' climbs out",
        ),
        ("reference", "/etc/passwd", "manifest reference record path '/etc/passwd' is absolute"),
        ("file", "../outside.txt", "manifest path '../outside.txt' climbs out"),
        ("symlink", "rows/link.tflite", "manifest graph path 'rows/link.tflite' leaves the release through a symlink"),
        ("unlisted", None, "is not listed in `files`"),
    ],
)
def test_clef_verify_reads_nothing_outside_its_release(release_copy, tmp_path, where, path, named):
    """Every manifest path must be relative, inside the release and hashed: checked before any file is
    hashed or any graph loaded (a graph outside, not hashed, would otherwise run instead of the real one)."""
    manifest = json.loads((release_copy / reader.MANIFEST).read_text())
    arts = manifest["artifacts"]
    if where == "artifact":
        arts[ROW]["file"] = path
    elif where == "reference":
        arts[ROW]["reference"]["file"] = path
    elif where == "file":
        manifest["files"][path] = {"sha256": "0" * 64, "size": 1}
    elif where == "symlink":
        outside = tmp_path / "outside.tflite"
        outside.write_bytes((release_copy / arts[ROW]["file"]).read_bytes())
        (release_copy / path).parent.mkdir(exist_ok=True)
        (release_copy / path).symlink_to(outside)
        manifest["files"][path] = {"sha256": snapshot.sha256_file(outside), "size": outside.stat().st_size}
        arts[ROW]["file"] = path
    else:
        path = arts[ROW]["file"]
        del manifest["files"][path]
    atomic.write_json(release_copy / reader.MANIFEST, manifest)
    proc = clef(release_copy.parent, "verify", str(release_copy))
    assert proc.returncode == 1 and "FAIL manifest" in proc.stdout and named in proc.stdout, proc.stdout
    assert "hashing" not in proc.stderr and "reference record in the interpreter" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("cut", [16, 32, 1000])
def test_clef_audit_refuses_a_truncated_graph(built, tmp_path, cut):
    data = (built / graph_file(built)).read_bytes()
    short = tmp_path / "row_L64.tflite"
    short.write_bytes(data[:-cut])
    proc = clef(tmp_path, "audit", str(short))
    assert proc.returncode == 2 and "is truncated or damaged" in proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_clef_verify_runs_the_reference_records(release_copy):
    """An altered expectation (hash updated in the manifest too) fails on the interpreter's figure."""
    from safetensors.torch import load_file, save_file

    ref = release_copy / "checks" / "row_L64.safetensors"
    record = load_file(str(ref))
    record["expected"] = record["expected"] * 1.01
    save_file(record, str(ref))
    manifest = json.loads((release_copy / reader.MANIFEST).read_text())
    manifest["files"]["checks/row_L64.safetensors"] = {"sha256": snapshot.sha256_file(ref), "size": ref.stat().st_size}
    atomic.write_json(release_copy / reader.MANIFEST, manifest)
    proc = clef(release_copy.parent, "verify", str(release_copy))
    assert proc.returncode == 1 and "FAIL row_L64: max rel" in proc.stdout, proc.stdout
    proc = clef(release_copy.parent, "verify", str(release_copy), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["passed"] is False and doc["graphs"]["row_L64"]["passed"] is False
    assert any(p.startswith("row_L64: reference record") for p in doc["problems"])


def test_clef_audit_names_revision_and_form(pipeline, built):
    manifest = reader.load_manifest(built)
    for path in {a.file for a in manifest.artifacts.values()}:
        proc = clef(built, "audit", path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert manifest.model.revision in proc.stdout and f"form {manifest.form}" in proc.stdout
        assert re.search(r"commit: +[0-9a-f]{40} \(clean\)", proc.stdout), proc.stdout
        assert "agrees" in proc.stdout and '"form": "' in proc.stdout  # the params it read
        for name in manifest.artifacts:  # a bundle: each graph it holds, by name
            assert f"graph:     {name}: " in proc.stdout, proc.stdout
    outside = clef(pipeline["repo"], "audit", "artifacts/rows/row_L64.tflite")
    assert outside.returncode == 0 and "none beside this file" in outside.stdout


def test_clef_audit_reports_a_manifest_that_disagrees(release_copy):
    manifest = json.loads((release_copy / reader.MANIFEST).read_text())
    manifest["form"] = "R32+sp+ec+dd+vs6"
    atomic.write_json(release_copy / reader.MANIFEST, manifest)
    proc = clef(release_copy, "audit", graph_file(release_copy))
    assert proc.returncode == 1 and "DISAGREES" in proc.stdout and "form is" in proc.stdout, proc.stdout


def test_clef_run_row_and_pair(built):
    proc = clef(built.parent, "run", "--release", str(built), "--text", "a decision to make", "--top", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "row_L64 (" in proc.stdout and "all finite: True" in proc.stdout
    assert proc.stdout.count(") ") >= 3  # three top tokens with their ids
    pair = clef(
        built.parent,
        "run",
        "--release",
        str(built),
        "--pair",
        "--text",
        "the shared context",
        "--question",
        "first?",
        "--question",
        "second?",
    )
    assert pair.returncode == 0, pair.stdout + pair.stderr
    assert "pair_P64_S64 (" in pair.stdout and pair.stdout.count("top lm_head tokens") == 2
    chosen = clef(built.parent, "run", "--release", str(built), "--text", "a decision", "--signature", "row_L256")
    assert chosen.returncode == 0 and "row_L256 (" in chosen.stdout, chosen.stdout + chosen.stderr


def test_clef_run_matches_the_torch_row_graph(built, tiny_snapshot):
    """What `clef run` computes from the release's host files is what the pipeline's torch graph gives."""
    from scripts.checks.tflite_check import interpreter
    from scripts.qwen35 import patch, row_graph
    from scripts.qwen35.host import Host, litert_signature

    manifest = reader.load_manifest(built)
    host = Host(built / "host")
    ref_host = Host(tiny_snapshot)
    ids = host.encode("a decision to make")
    assert ids == ref_host.encode("a decision to make")
    record = host.record(ids, 64)
    assert all(torch.equal(record[k], ref_host.record(ids, 64)[k]) for k in record)
    model, _, _ = patch.load(tiny_snapshot, manifest.form, progress=False)
    with torch.no_grad():
        ref = row_graph.ClefRowPrefill(model, 64)(**record)["hidden"][0, : len(ids)]
    art = manifest.artifacts[ROW]
    runner = interpreter(built / art.file).get_signature_runner(art.signature_names["serving_default"])
    out = litert_signature(runner)(**record)["hidden"]
    from scripts.checks import compare

    bounds = params.bounds(manifest.params, "verify_tflite", ("rel_vs_torch", "rel_per_position_vs_torch"))
    assert compare.judge([compare.figures("vs_torch", out[0, : len(ids)], ref)], bounds) == []


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["verify", "no/such/dir"], "no/such/dir is neither a release directory nor a release tarball"),
        (["audit", "params.yaml"], "not a readable .tflite"),
        (
            ["run", "--release", "artifacts/release", "--text", " ".join(str(i) for i in range(400))],
            "no row graph in this release is large enough",
        ),
        (
            ["run", "--release", "artifacts/release", "--pair", "--text", "context"],
            "--pair needs at least one --question",
        ),
        (["run", "--release", "artifacts/rows", "--text", "x"], "is not a release: no manifest.json"),
        (["run", "--release", "artifacts/release", "--text", "x", "--signature", "row_L7"], "no such signature"),
        (["run", "--release", "artifacts/release", "--text", "x", "--signature", "prefix_P64_S64"], "needs --pair"),
    ],
)
def test_clef_refuses_bad_input_with_one_line(pipeline, args, fragment):
    proc = clef(pipeline["repo"], *args)
    assert_one_line_error(proc, fragment)


def test_clef_runs_as_a_module(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "clef", "--help"], cwd=tmp_path, env=tool_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0 and "verify" in proc.stdout and "audit" in proc.stdout


def test_clef_debug_shows_the_traceback(tmp_path):
    proc = clef(tmp_path, "--debug", "verify", "no/such/dir")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "neither a release directory" in proc.stderr


def rehash(root: Path, names: list[str]) -> None:
    """Update the manifest's hashes of `names` (files and graph entries) to the files as they now are:
    the consistent edit a manifest alone cannot tell from a release."""
    manifest = json.loads((root / reader.MANIFEST).read_text())
    for name in names:
        entry = {"sha256": snapshot.sha256_file(root / name), "size": (root / name).stat().st_size}
        manifest["files"][name] = entry
        for art in manifest["artifacts"].values():
            if art["file"] == name:
                art.update(sha256=entry["sha256"], md5=builder.graph_digests(root / name).md5)
    atomic.write_json(root / reader.MANIFEST, manifest)


def forge_commit(root: Path, graph: str) -> str:
    """Rewrite the commit a graph's metadata records to zeros, and its manifest hashes to match."""
    from scripts.litert import tflite_file

    commit = reader.graph_metadata(tflite_file.read_metadata(root / graph), ROW)["git"]["commit"]
    data = (root / graph).read_bytes()
    assert data.count(commit.encode()) >= 1
    (root / graph).write_bytes(data.replace(commit.encode(), b"0" * 40))
    rehash(root, [graph])
    return commit


def loosen_thresholds(root: Path) -> None:
    manifest = json.loads((root / reader.MANIFEST).read_text())
    for art in manifest["artifacts"].values():
        art["reference"]["threshold"] = 1.0
    atomic.write_json(root / reader.MANIFEST, manifest)


def flip_weight_byte(root: Path) -> None:
    f = root / graph_file(root)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    rehash(root, [graph_file(root)])


def files_layout(release: Path, repo: Path) -> Path:
    """`release` rewritten as release.layout `files` places graphs (rows/, pairs/: each graph's own
    .tflite, as the pipeline exported it), the bundle gone, the manifest rehashed: a release whose graphs
    are separate files, for a test to put one graph's file in another's place."""
    manifest = json.loads((release / reader.MANIFEST).read_text())
    for held in {a["file"] for a in manifest["artifacts"].values()}:
        (release / held).unlink()
        del manifest["files"][held]
    placed = []
    for name, art in manifest["artifacts"].items():
        rel = f"{art['kind']}s/{name}.tflite"
        (release / rel).parent.mkdir(exist_ok=True)
        shutil.copyfile(
            repo / (layout.ROWS if art["kind"] == "row" else layout.PAIRS) / f"{name}.tflite", release / rel
        )
        art.update(file=rel, signature_names={own: own for own in art["signature_names"]})
        placed.append(rel)
    manifest.update(layout="files", bundle=None)
    atomic.write_json(release / reader.MANIFEST, manifest)
    rehash(release, placed)
    return release


def poison_weights(path: Path) -> int:
    """Every constant stored after the flatbuffer head that only float tensors read, overwritten with NaN
    of their type (the hashes are left to the caller) -> how many buffers."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    from scripts.litert import tflite_file

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_file.read_head(path)))
    nan = {schema.TensorType.FLOAT16: np.float16("nan"), schema.TensorType.FLOAT32: np.float32("nan")}
    readers: dict[int, set] = {}
    for sg in model.subgraphs:
        for t in sg.tensors:
            readers.setdefault(t.buffer, set()).add(t.type)
    poisoned = 0
    with open(path, "r+b") as f:
        for i, types in readers.items():
            buffer = model.buffers[i]
            if buffer.offset > 1 and len(types) == 1 and (value := nan.get(next(iter(types)))) is not None:
                f.seek(buffer.offset)
                f.write(np.full(buffer.size // value.itemsize, value).tobytes())
                poisoned += 1
    return poisoned


TEXT = "a decision to make"  # 5 tokens: clef run picks row_L64, and pair_P64_S64 with --pair


def run_line(release: Path, *args: str) -> str:
    """`clef run` on `release` refused with one line, the release left as it was, no answer printed."""
    before = tree(release)
    proc = clef(release.parent, "run", "--release", str(release), "--text", TEXT, *args)
    line = assert_one_line_error(proc)
    assert "top lm_head tokens" not in proc.stdout and tree(release) == before, proc.stdout
    return line


@pytest.mark.parametrize(
    "source, consistent, named",
    [
        (layout.row_path(256), True, ["its metadata: L is 256, expected 64", "signature 'serving_default': cos"]),
        (layout.row_path(256), False, ["its metadata: L is 256, expected 64"]),
        (layout.pair_path(64, 64), True, ["kind is 'pair', expected 'row'", "no signature 'serving_default'"]),
    ],
)
def test_clef_run_refuses_another_graph_in_a_graphs_file(pipeline, release_copy, source, consistent, named):
    """Layout `files`: row_L64's file holding a row of L=256 or a pair ran and printed NaN as its answer.
    The file's own metadata and signatures are held to the manifest's entry before it is loaded, even
    when the manifest's hashes were updated to the swapped file (`consistent`)."""
    release = files_layout(release_copy, pipeline["repo"])
    assert clef(release.parent, "run", "--release", str(release), "--text", TEXT).returncode == 0
    shutil.copyfile(pipeline["repo"] / source, release / "rows" / "row_L64.tflite")
    if consistent:
        rehash(release, ["rows/row_L64.tflite"])
    line = run_line(release)
    assert "rows/row_L64.tflite is not the row_L64 the manifest names: " in line, line
    for fragment in named:
        assert fragment in line, (fragment, line)


@pytest.mark.parametrize(
    "where, named",
    [("outside", "manifest graph path '../outside.tflite' climbs out with '..'"), ("missing", "is missing")],
)
def test_clef_run_loads_no_graph_the_manifest_does_not_hash(release_copy, where, named):
    """The graph's path is held as `clef verify` holds it (reader.check_paths) before the file is opened:
    a graph outside the release ran, and a missing one was a FileNotFoundError."""
    if where == "outside":
        manifest = json.loads((release_copy / reader.MANIFEST).read_text())
        shutil.copyfile(release_copy / graph_file(release_copy), release_copy.parent / "outside.tflite")
        manifest["artifacts"][ROW]["file"] = "../outside.tflite"
        atomic.write_json(release_copy / reader.MANIFEST, manifest)
    else:
        (release_copy / graph_file(release_copy)).unlink()
    assert named in run_line(release_copy)


@pytest.mark.parametrize("pair", [False, True])
def test_clef_run_refuses_a_changed_bundle(release_copy, pair):
    """A byte of the bundle changed (its metadata and signatures still agree): its sha256 against the
    manifest's `files`, the check `clef verify` makes (reader.changed), before the graph is loaded."""
    bundle = graph_file(release_copy)
    data = bytearray((release_copy / bundle).read_bytes())
    data[len(data) // 2] ^= 0x01
    (release_copy / bundle).write_bytes(bytes(data))
    args = ["--pair", "--question", "and then?"] if pair else []
    line = run_line(release_copy, *args)
    graph = "pair_P64_S64" if pair else ROW
    assert f"{bundle} is not the {graph} the manifest names: sha256 differs from the manifest" in line, line


def test_clef_run_refuses_a_bundle_replaced_by_a_row(pipeline, release_copy):
    """The bundle's file replaced by a row graph (hashes updated): the graph the manifest names is not in it."""
    bundle = graph_file(release_copy)
    shutil.copyfile(pipeline["repo"] / layout.row_path(256), release_copy / bundle)
    rehash(release_copy, [bundle])
    line = run_line(release_copy)
    assert f"{bundle} is not the {ROW} the manifest names: its metadata: L is 256, expected 64" in line, line
    assert f"no signature '{ROW}'" in line, line


@pytest.mark.parametrize("pair", [False, True])
def test_clef_run_refuses_hidden_states_that_are_not_finite(release_copy, pair):
    """Weights turned to NaN with the manifest rehashed to match (a graph that passes every file check
    and computes NaN): an error naming the graph and the positions, never a printed answer."""
    bundle = graph_file(release_copy)
    assert poison_weights(release_copy / bundle) > 0
    rehash(release_copy, [bundle])
    if pair:
        line = run_line(release_copy, "--pair", "--question", "and then?")
        assert f"pair_P64_S64 ({bundle}, prefix_P64_S64) on the context gave hidden states" in line, line
    else:
        line = run_line(release_copy)
        assert f"{ROW} ({bundle}) gave hidden states" in line, line
    assert re.search(r"not finite \(NaN or inf\) at (\d+) of \1 real positions", line), line


def test_clef_verify_with_the_key(pipeline, built):
    proc = clef(built.parent, "verify", str(built), "--key", str(pipeline["public_key"]), "--require-signature")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok   signature: model.sig verifies with key sha256:" in proc.stdout and "all checks passed" in proc.stdout


def test_openssf_model_signing_verifies_the_release_on_its_own(pipeline, built):
    """The independent check the README gives a device team: OpenSSF's own CLI, not our code."""
    tool = Path(sys.executable).parent / "model_signing"
    args = ["verify", "key", "--signature", str(built / "model.sig"), "--public_key", str(pipeline["public_key"])]
    proc = subprocess.run([str(tool), *args, str(built)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Verification succeeded" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "edit, named, passes_without_key",
    [
        # the forgery: provenance rewritten, hashes updated; the manifest alone cannot see it
        (lambda r: forge_commit(r, graph_file(r)), ["GRAPH", "manifest.json"], True),
        # a graph and the manifest edited consistently
        (flip_weight_byte, ["GRAPH", "manifest.json"], None),
        # the manifest alone: thresholds loosened
        (loosen_thresholds, ["manifest.json"], True),
    ],
)
def test_the_signature_catches_consistent_edits(pipeline, release_copy, edit, named, passes_without_key):
    named = [graph_file(release_copy) if n == "GRAPH" else n for n in named]
    edit(release_copy)
    if passes_without_key:  # what the release had before it was signed: these edits pass the manifest's checks
        assert clef(release_copy.parent, "verify", str(release_copy)).returncode == 0
    proc = clef(release_copy.parent, "verify", str(release_copy), "--key", str(pipeline["public_key"]))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for name in named:
        assert f"FAIL signature: changed file: {name} (not what was signed)" in proc.stdout, proc.stdout
    assert "nothing in the release was loaded" in proc.stdout
    assert "reference record in the interpreter" not in proc.stderr and not re.search(r"hashing \d+ files", proc.stderr)


def test_clef_verify_refuses_another_key_and_an_altered_signature(release_copy, tmp_path):
    from scripts.release import signing

    _, other = signing.make_keys(tmp_path / "other")
    proc = clef(release_copy.parent, "verify", str(release_copy), "--key", str(other))
    assert proc.returncode == 1 and "FAIL model.sig does not verify with key" in proc.stdout, proc.stdout
    bundle = json.loads((release_copy / signing.SIGNATURE).read_text())
    bundle["dsseEnvelope"]["payload"] = bundle["dsseEnvelope"]["payload"][:-8] + "AAAAAAA="
    (release_copy / signing.SIGNATURE).write_text(json.dumps(bundle))
    proc = clef(release_copy.parent, "verify", str(release_copy), "--key", str(other))
    assert proc.returncode == 1 and "FAIL model.sig" in proc.stdout, proc.stdout


def test_clef_verify_bad_key_input(pipeline, release_copy, tmp_path):
    from scripts.release import signing

    key = str(pipeline["public_key"])
    (release_copy / signing.SIGNATURE).unlink()
    assert_one_line_error(
        clef(release_copy.parent, "verify", str(release_copy), "--key", key, "--require-signature"),
        "is not signed (no model.sig) and --require-signature was given",
    )
    unsigned = clef(release_copy.parent, "verify", str(release_copy), "--key", key)
    assert unsigned.returncode == 0 and "note unsigned release: --key" in unsigned.stdout, unsigned.stdout
    assert_one_line_error(
        clef(release_copy.parent, "verify", str(release_copy), "--require-signature"), "--require-signature needs --key"
    )
    (tmp_path / "junk.pub").write_text("not a key")
    assert_one_line_error(
        clef(release_copy.parent, "verify", str(release_copy), "--key", str(tmp_path / "junk.pub")),
        "is not a PEM public key",
    )
    assert_one_line_error(
        clef(release_copy.parent, "verify", str(release_copy), "--key", str(pipeline["repo"] / "params.yaml")),
        "is not a PEM public key",
    )


def test_clef_audit_names_the_signing_key(pipeline, built, release_copy):
    from scripts.release import signing

    fingerprint = signing.fingerprint(signing.load_public_key(pipeline["public_key"]))
    proc = clef(built, "audit", graph_file(built))
    assert proc.returncode == 0 and f"signature: model.sig by key {fingerprint}" in proc.stdout, proc.stdout
    (release_copy / signing.SIGNATURE).unlink()
    proc = clef(release_copy, "audit", graph_file(release_copy))
    assert proc.returncode == 1 and "signature: DISAGREES" in proc.stdout and "is missing" in proc.stdout


def test_clef_verify_fails_a_figure_far_from_the_recorded_one(release_copy):
    """Under the threshold but more than max_over_recorded x what the release measured: a different
    runtime or a changed graph. The expectation is scaled to land between the two bounds."""
    from safetensors.torch import load_file, save_file

    manifest = json.loads((release_copy / reader.MANIFEST).read_text())
    ref = manifest["artifacts"][ROW]["reference"]
    drift_bound = ref["max_over_recorded"] * max(ref["max_rel"], reader.FP32_EPS)
    target = (drift_bound * ref["threshold"]) ** 0.5  # halfway between the two bounds, on a log scale
    assert target > 1.3 * drift_bound and target < ref["threshold"] / 1.3, ref  # room between the bounds
    path = release_copy / ref["file"]
    record = load_file(str(path))
    record["expected"] = record["expected"] * (1 + target)
    save_file(record, str(path))
    rehash(release_copy, [ref["file"]])
    proc = clef(release_copy.parent, "verify", str(release_copy))
    assert proc.returncode == 1, proc.stdout
    assert f"is more than {ref['max_over_recorded']:g}x the" in proc.stdout and "> " not in proc.stdout, proc.stdout


def readers_of_largest_weight(path: Path) -> tuple[int, set[str]]:
    """The file offset of the bundle's largest constant, and the signatures whose subgraph reads it."""
    from ai_edge_litert import schema_py_generated as schema

    data = path.read_bytes()
    model = schema.Model.GetRootAs(data, 0)
    sizes = {i: model.Buffers(i).Size() for i in range(model.BuffersLength()) if model.Buffers(i).Offset() > 1}
    largest = max(sizes, key=sizes.get)
    readers = set()
    for s in range(model.SignatureDefsLength()):
        sig = model.SignatureDefs(s)
        sg = model.Subgraphs(sig.SubgraphIndex())
        if any(sg.Tensors(t).Buffer() == largest for t in range(sg.TensorsLength())):
            readers.add(sig.SignatureKey().decode())
    return model.Buffers(largest).Offset(), readers


def test_a_flipped_byte_in_a_shared_weight_fails_every_graph_that_reads_it(release_copy):
    """The bundle stores each weight once: one flipped byte (the manifest rehashed to match, as a
    consistent edit) must fail clef verify for every graph whose signatures read that weight."""
    file = graph_file(release_copy)
    offset, readers = readers_of_largest_weight(release_copy / file)
    manifest = reader.load_manifest(release_copy)
    failing = {n for n, a in manifest.artifacts.items() if set(a.signature_names.values()) & readers}
    assert len(readers) > 1 and failing == set(manifest.artifacts), (readers, failing)  # read by every signature
    data = bytearray((release_copy / file).read_bytes())
    data[offset + 3] ^= 0x40  # the high byte of the first float: its exponent
    (release_copy / file).write_bytes(bytes(data))
    rehash(release_copy, [file])
    proc = clef(release_copy.parent, "verify", str(release_copy))
    assert proc.returncode == 1, proc.stdout
    for name in failing:
        assert f"FAIL {name}: max rel" in proc.stdout, (name, proc.stdout)


def test_clef_verify_refuses_a_bundle_whose_signatures_the_manifest_does_not_name(release_copy):
    manifest = json.loads((release_copy / reader.MANIFEST).read_text())
    manifest["artifacts"][ROW]["signature_names"] = {"serving_default": "row_L999"}
    atomic.write_json(release_copy / reader.MANIFEST, manifest)
    proc = clef(release_copy.parent, "verify", str(release_copy))
    file = graph_file(release_copy)
    assert proc.returncode == 1, proc.stdout
    assert f"FAIL {file}: no signature 'row_L999', which the manifest names" in proc.stdout, proc.stdout
    assert f"FAIL {file}: signature 'row_L64' is not named by the manifest" in proc.stdout, proc.stdout


def test_clef_verify_and_audit_refuse_a_file_whose_metadata_names_another_precision(release_copy):
    """The bundle's metadata rewritten to say fp32 while its weights are stored fp16, the manifest rehashed
    (a consistent edit): both commands name the disagreement from the tensors themselves."""
    file = graph_file(release_copy)
    path = release_copy / file
    data = path.read_bytes()
    declared = [b'"weights": "fp16"', b'"weights":"fp16"']
    found = [d for d in declared if d in data]
    assert found, "the release is not fp16 (params.yaml weights changed?)"
    path.write_bytes(data.replace(found[0], found[0].replace(b"fp16", b"fp32")))
    rehash(release_copy, [file])
    proc = clef(release_copy.parent, "verify", str(release_copy))
    said = "metadata says weights fp32, but FULLY_CONNECTED weights are stored as FLOAT16"
    assert proc.returncode == 1 and f"FAIL {file}: {said}" in proc.stdout, proc.stdout
    proc = clef(release_copy.parent, "audit", str(path))
    assert proc.returncode != 0 and said in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
