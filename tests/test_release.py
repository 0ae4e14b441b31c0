"""The release stage and scripts/release/'s builder and reader: hashes catch a changed byte, a missing
and an extra file; the tarball is byte-reproducible; the manifest holds what the stage measured; a
release refused leaves none half-built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts.checkpoint import snapshot
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.provenance import GitState
from scripts.release import builder, reader, references, signing
from scripts.release.manifest import Manifest, ModelSection
from tests.conftest import assert_one_line_error, run_stage


def small_release(root: Path) -> Manifest:
    """A directory with a manifest listing its files, as the release stage writes it (no graphs)."""
    (root / "rows").mkdir(parents=True)
    (root / "rows" / "a.tflite").write_bytes(bytes(range(256)) * 4)
    (root / "host").mkdir()
    (root / "host" / "config.json").write_text("{}")
    manifest = Manifest(
        reader.FORMAT,
        "small",
        "files",
        None,
        ModelSection("org/model", "0" * 40, "hub", {}),
        "R64",
        "fp32",
        {},
        {},
        GitState(None, None, []),
        builder.HostSection("reference", {}, None),
        {},
        {},
        {},
        builder.file_table(root),
        signing.Unsigned(False, "no key"),
    )
    atomic.write_json(root / reader.MANIFEST, manifest.to_json())
    return manifest


def test_check_files_passes_an_untouched_release(tmp_path):
    manifest = small_release(tmp_path)
    assert set(manifest.files) == {"rows/a.tflite", "host/config.json"}
    assert reader.load_manifest(tmp_path) == manifest
    assert reader.check_files(tmp_path, reader.load_manifest(tmp_path)) == []


@pytest.mark.parametrize(
    "tamper, expected",
    [
        (
            lambda r: r.joinpath("rows/a.tflite").write_bytes(
                bytes([1]) + r.joinpath("rows/a.tflite").read_bytes()[1:]
            ),
            "changed file: rows/a.tflite",
        ),
        (lambda r: r.joinpath("host/config.json").unlink(), "missing file: host/config.json"),
        (lambda r: r.joinpath("host/notes.txt").write_text("x"), "extra file: host/notes.txt"),
    ],
)
def test_check_files_names_the_tampered_file(tmp_path, tamper, expected):
    manifest = small_release(tmp_path)
    tamper(tmp_path)
    problems = reader.check_files(tmp_path, manifest)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_load_manifest_refuses_what_is_not_a_release(tmp_path):
    with pytest.raises(ClefError, match="no manifest.json"):
        reader.load_manifest(tmp_path)
    (tmp_path / reader.MANIFEST).write_text('{"format": "something-else"}')
    with pytest.raises(ClefError, match="format 'something-else'"):
        reader.load_manifest(tmp_path)


def test_tarball_is_byte_reproducible(tmp_path):
    """Times, owners and the number of compression workers change nothing (32 MB: many zstd jobs)."""
    small_release(tmp_path / "r")
    (tmp_path / "r" / "rows" / "b.tflite").write_bytes(np.random.default_rng(0).bytes(32 * 2**20))
    builder.write_tarball(tmp_path / "r", tmp_path / "one.tar.zst", "top", workers=1)
    (tmp_path / "r" / "rows" / "a.tflite").touch()  # a new mtime changes nothing
    builder.write_tarball(tmp_path / "r", tmp_path / "two.tar.zst", "top", workers=2)
    assert (tmp_path / "one.tar.zst").read_bytes() == (tmp_path / "two.tar.zst").read_bytes()
    with builder.open_tarball(tmp_path / "one.tar.zst") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert all(m.mtime == 0 and m.uid == 0 for m in members)
    assert names == sorted(names) and "top/rows/a.tflite" in names and "top/manifest.json" in names


def test_signatures_take_shapes_from_the_file_and_meaning_from_the_contract():
    census = {
        "signatures": {
            "serving_default": {
                "inputs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
                "outputs": [{"name": "hidden", "shape": [1, 4], "dtype": "float32"}],
            }
        }
    }
    contract = {
        "inputs": [{"name": "x", "shape": [1, 999], "meaning": "the input"}],
        "outputs": [{"name": "hidden", "meaning": "the output"}],
    }
    sig = builder.signatures(census, contract)["serving_default"].to_json()
    assert sig["inputs"] == [{"name": "x", "shape": [1, 4], "dtype": "float32", "meaning": "the input"}]
    assert sig["outputs"][0]["meaning"] == "the output"


def test_lock_stages_reads_the_stages_upstream_of_the_release_only(tmp_path):
    """export@64 writes what the release reads; latency reads the graph but the release does not read
    latency's output, so latency's hashes (which can change after the release ran) are not its provenance."""
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  release:\n    cmd: python -m stages.release\n    deps:\n    - artifacts/rows\n"
    )
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  fetch:\n    cmd: python -m stages.fetch\n    outs:\n    - path: hf\n"
        "      md5: zzz.dir\n  export@64:\n    cmd: python -m stages.export --length 64\n"
        "    deps:\n    - path: hf\n      md5: aaa.dir\n    outs:\n    - path: artifacts/rows/row_L64.tflite\n"
        "      md5: bbb\n  latency:\n    cmd: python -m stages.latency\n    deps:\n"
        "    - path: artifacts/rows\n      md5: ccc.dir\n    outs:\n    - path: results/latency.json\n"
        "      md5: ddd\n  release:\n    cmd: python -m stages.release\n"
    )
    stages = builder.lock_stages(tmp_path / "dvc.lock", pipeline=tmp_path / "dvc.yaml")
    assert list(stages) == ["export@64", "fetch"]  # fetch through export's dep on hf
    assert stages["export@64"].outs == {"artifacts/rows/row_L64.tflite": "bbb"}
    assert builder.lock_stages(tmp_path / "absent.lock", pipeline=tmp_path / "dvc.yaml") == {}


def test_tensor_hash_is_dtype_exact():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert reader.tensor_sha256(t.to(torch.bfloat16)) != reader.tensor_sha256(t)
    assert reader.tensor_sha256(t.to(torch.bfloat16)) == reader.tensor_sha256(t.clone().to(torch.bfloat16))


@pytest.mark.parametrize(
    "pairs, fragment",
    [
        ("x", "must be a non-empty list"),
        ([], "must be a non-empty list"),
        ([{"prefix": 64}], "exactly prefix and suffix"),
        ([{"prefix": 0, "suffix": 64}], "prefix is not a positive integer"),
        ([{"prefix": 64, "suffix": 64}, {"prefix": 64, "suffix": 64}], "listed twice"),
    ],
)
def test_check_pairs(pairs, fragment):
    with pytest.raises(ClefError, match=fragment):
        params.check_section({"pairs": pairs}, "pairs")


def test_release_stage_refuses_a_missing_graph_before_building(workdir):
    proc = run_stage("release", workdir)
    assert_one_line_error(proc, "artifacts/rows/row_L64.tflite", "export")
    assert not (workdir / "artifacts" / "release").exists() and not (workdir / "artifacts" / "dist").exists()


def test_release_stage_refuses_an_unknown_host_weights_mode(workdir):
    p = (workdir / "params.yaml").read_text().replace("host_weights: include", "host_weights: maybe")
    (workdir / "params.yaml").write_text(p)
    assert_one_line_error(run_stage("release", workdir), "release.host_weights 'maybe'")


def test_make_release_output(pipeline, built):
    manifest = reader.load_manifest(built)
    p = params.load(path=pipeline["repo"] / "params.yaml")
    rows = {a.L for a in manifest.artifacts.values() if a.kind == "row"}
    pairs = {(a.P, a.S) for a in manifest.artifacts.values() if a.kind == "pair"}
    assert rows == set(p["lengths"]) and pairs == {(q["prefix"], q["suffix"]) for q in p["pairs"]}
    assert manifest.form == p["form"] and manifest.params == p
    assert manifest.git.clean is True and len(manifest.git.commit) == 40
    snap = json.loads((pipeline["repo"] / "results/snapshot.json").read_text())
    assert manifest.model.revision == snap["revision"]
    assert {f: e["sha256"] for f, e in manifest.model.snapshot_files.items()} == {
        e["name"]: e["sha256"] for e in snap["files"]
    }
    assert manifest.layout == p["release"]["layout"] == "bundle"
    assert not (built / "rows").exists() and not (built / "pairs").exists(), "per-graph copies in a bundle release"
    bundled = manifest.bundle
    assert {a.file for a in manifest.artifacts.values()} == {bundled.file}
    assert bundled.duplicate_constants == {"buffers": 0, "bytes": 0}  # every weight stored once
    assert set(bundled.identity_vs_own_file) == {"cpu", "gpu fp32", "gpu fp16", "gpu mixed"}
    assert all(
        v["identical"] and v["signatures_run"] == len(manifest.artifacts) for v in bundled.identity_vs_own_file.values()
    )
    workspace_bundle = pipeline["repo"] / layout.BUNDLE / Path(bundled.file).name
    for path, art in manifest.artifacts.items():
        # the packaged bundle is the one the bundle stage wrote (dvc.lock holds its directory's hash)
        assert art.dvc_lock.stage == "bundle" and art.sha256 == snapshot.sha256_file(workspace_bundle), path
        # the reference record is the one its verify stage computed with the torch model
        computed = pipeline["repo"] / layout.reference_path(Path(path))
        assert manifest.files[art.reference.file].sha256 == snapshot.sha256_file(computed), path
        ref = art.reference
        assert ref.max_rel <= ref.threshold and ref.max_rel_per_position <= ref.threshold_per_position
        # the release ran no graph: its figures are what the verify stage measured on that very record,
        # and what running it through the packaged graph (as `clef verify` does) gives, to the last bit
        measured = json.loads((pipeline["repo"] / layout.reference_figures_path(Path(path))).read_text())
        assert measured["record_sha256"] == manifest.files[ref.file].sha256, path
        record = references.load_reference(built, ref.file)
        rerun = references.run_reference(built / art.file, art.kind, record, names=art.signature_names)
        assert (
            (ref.max_rel, ref.max_rel_per_position)
            == (
                measured["rel_vs_expected"],
                measured["rel_per_position_vs_expected"],
            )
            == (rerun.rel_vs_expected, rerun.rel_per_position_vs_expected)
        ), path
        for sig in art.signatures.values():
            assert all(e.meaning and e.shape and e.dtype == "float32" for e in sig.inputs + sig.outputs)
    assert {"fetch", "stack", "verify_kernel", "export_stock"} <= set(manifest.stages)
    assert all(stage.deps or stage.outs for stage in manifest.stages.values())
    assert manifest.host.weights == "include" and (built / reader.HOST_WEIGHTS).is_file()
    assert (built / "host" / "tokenizer.json").is_file() and (built / reader.CARD).is_file()
    card_text = (built / reader.CARD).read_text()  # the tiny snapshot has no model card of its own: said so
    assert card_text.startswith(f"---\nbase_model: {manifest.model.repo}\n") and "license:" not in card_text
    assert "carries no model card" in card_text
    for picture in ("pictures/errors.svg", "pictures/gpu_modes.svg", "pictures/positions.svg"):  # hashed like all
        assert f"]({picture})" in card_text and picture in manifest.files, picture
    for path, art in manifest.artifacts.items():  # the per-position picture's curves, one figure a position
        curve, record = art.reference.positions, references.load_reference(built, art.reference.file)
        assert len(curve) == record["expected"].shape[1] and max(curve) == art.reference.max_rel_per_position
        gpu = art.gpu.positions
        assert {"fp32_vs_torch", "fp16_vs_f64", "mixed_vs_f64", "floor_vs_f64"} <= set(gpu), path
        assert {len(v) for k, v in gpu.items() if k != "record"} == {len(curve)}, path
    tarballs = list((built.parent / "dist").glob("*" + builder.TARBALL_SUFFIX))
    assert [t.name for t in tarballs] == [manifest.name + builder.TARBALL_SUFFIX]
    assert snap["revision"][:12] in manifest.name and p["form"] in manifest.name


def test_the_release_is_signed_with_the_params_key(pipeline, built):
    from scripts.release import signing

    manifest = reader.load_manifest(built)
    fingerprint = signing.fingerprint(signing.load_public_key(pipeline["public_key"]))
    assert manifest.signing.signed and manifest.signing.key_fingerprint == fingerprint
    assert signing.claimed_key(built) == fingerprint and signing.SIGNATURE not in manifest.files
    key_path = str(manifest.params["release"]["signing_key"])
    key_bytes = Path(key_path).read_bytes()
    for f in [*built.rglob("*"), pipeline["repo"] / "dvc.lock"]:  # the private key's bytes go nowhere
        assert not f.is_file() or key_bytes not in f.read_bytes(), f
    assert key_bytes not in (pipeline["log"] + pipeline["stderr"]).encode()
    assert "## Signature" in (built / reader.CARD).read_text() and fingerprint in (built / reader.CARD).read_text()
    tarball = next((built.parent / "dist").glob("*" + builder.TARBALL_SUFFIX))
    with builder.open_tarball(tarball) as tar:
        assert f"{manifest.name}/{signing.SIGNATURE}" in tar.getnames()


def tree_hashes(root: Path) -> dict:
    return {str(f.relative_to(root)): snapshot.sha256_file(f) for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.fixture
def pipeline_copy(pipeline, tmp_path) -> Path:
    """The pipeline's workspace (params, dvc.lock, hf/, artifacts/, results/) copied to run a stage in."""
    repo = pipeline["repo"]
    for name in ("params.yaml", "dvc.yaml", "dvc.lock"):
        shutil.copy(repo / name, tmp_path / name)
    for name in ("hf", "artifacts", "results"):
        shutil.copytree(repo / name, tmp_path / name)
    for f in tmp_path.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)
    return tmp_path


def edit_params(old: str, new: str):
    def edit(repo: Path) -> None:
        text = (repo / "params.yaml").read_text()
        assert old in text
        (repo / "params.yaml").write_text(text.replace(old, new, 1))

    return edit


@pytest.mark.parametrize(
    "edit, fragments",
    [
        # after preflight: the first reference record is over a threshold no graph can meet
        (edit_params("max_rel_vs_torch: 1.0e-4", "max_rel_vs_torch: 1.0e-12"), ["reference record", "> 1e-12"]),
        # before any work: the signing key has gone
        (
            edit_params("signing_key: /", "signing_key: /nonexistent/"),
            ["release.signing_key: no key file /nonexistent/"],
        ),
        # as it packages the first graph: its reference record is not the one verify_tflite measured
        (
            lambda repo: shutil.copy(
                repo / "results/references/row_L256.safetensors", repo / "results/references/row_L64.safetensors"
            ),
            ["results/references/row_L64.safetensors is not the record verify_tflite measured", "rerun verify_tflite"],
        ),
        # before any work: what verify_pair measured running a pair's reference record is missing
        (
            lambda repo: (repo / "results/references/pair_P64_S64.json").unlink(),
            ["no results/references/pair_P64_S64.json: run the verify_pair stage first"],
        ),
        # before any work: a graph's reference record, which its verify stage writes, is missing
        (
            lambda repo: (repo / "results/references/pair_P64_S64.safetensors").unlink(),
            ["no results/references/pair_P64_S64.safetensors: run the verify_pair stage first"],
        ),
    ],
)
def test_a_refused_release_leaves_no_partial_and_the_previous_release(pipeline_copy, edit, fragments):
    artifacts = pipeline_copy / "artifacts"
    before = {d: tree_hashes(artifacts / d) for d in ("release", "dist")}
    edit(pipeline_copy)
    assert_one_line_error(run_stage("release", pipeline_copy), *fragments)
    assert sorted(p.name for p in artifacts.iterdir()) == ["bundle", "dist", "pairs", "release", "rows"]
    assert {d: tree_hashes(artifacts / d) for d in ("release", "dist")} == before


def test_the_release_stage_refuses_a_bundle_that_is_not_of_the_graphs_there(pipeline):
    """Params asking for other lengths, and a graph file changed after the bundle was made from it: one
    line each, and the release already built stays as it was."""
    repo = pipeline["repo"]
    before = snapshot.sha256_file(repo / "artifacts/release/manifest.json")
    params_text = (repo / "params.yaml").read_text()
    try:
        (repo / "params.yaml").write_text(params_text.replace("lengths: [64, 256]", "lengths: [64]"))
        assert_one_line_error(run_stage("release", repo), "params.yaml asks for", "rerun the bundle stage")
    finally:
        (repo / "params.yaml").write_text(params_text)
    graph = repo / layout.row_path(256)
    original = graph.read_bytes()
    try:
        graph.unlink()  # a DVC-cached file is a read-only hard link: replaced, never written through
        graph.write_bytes(original + bytes(64))
        assert_one_line_error(
            run_stage("release", repo), f"{layout.row_path(256)} is not the file the bundle", "rerun the bundle stage"
        )
    finally:
        graph.unlink()
        graph.write_bytes(original)
    assert snapshot.sha256_file(repo / "artifacts/release/manifest.json") == before
