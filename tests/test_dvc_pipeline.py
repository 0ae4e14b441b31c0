"""dvc.yaml is honest (every stage depends on all the code it runs and declares the params it reads),
and the whole pipeline runs on the embedded default in a temporary copy of the repo (the session's
`pipeline` fixture): a second run does nothing, a rebuild is byte-identical, a parameter change reruns
exactly the stages that read it, metrics and plots are what DVC users expect, a release survives a
round trip through a DVC remote, and `dvc exp run -S form=...` reaches every stage that reads the form."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scripts.checks import controls
from scripts.litert import tflite_file
from scripts.pipeline import atomic, bounds, layout, quiet, readme, stage_deps
from scripts.release import builder
from tests.conftest import ROOT, clef, dvc, dvc_run, git
from tests.s3_server import CREDENTIALS, REGION, add_s3_remote, s3_server, set_credentials

STAGES = {name: st.get("do", st) for name, st in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()}


def test_code_deps_are_generated_from_the_imports():
    """Every stage depends on exactly the files of ours it runs: dvc.yaml's lists are what
    scripts/pipeline/stage_deps.py derives from the imports."""
    _, changed = stage_deps.rewrite((ROOT / "dvc.yaml").read_text())
    assert not changed, f"code deps differ from the imports for {changed}: run python -m scripts.pipeline.stage_deps"


def test_a_new_import_makes_the_deps_stale(tmp_path):
    """Broken once on purpose: an entry point that imports one more module of ours, or one fewer."""
    for top in ("scripts", "stages"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "dvc.yaml").read_text()
    entry = tmp_path / "stages/fetch.py"
    entry.write_text("from scripts.checks import compare  # noqa: F401\n" + entry.read_text())
    fixed, changed = stage_deps.rewrite(text, tmp_path)
    assert changed == ["fetch"] and "scripts/checks/compare.py" in fixed.split("  fetch:")[1].split("  stack:")[0]
    (tmp_path / "stages/check_params.py").write_text("")
    assert "check_params" in stage_deps.rewrite(text, tmp_path)[1]


def test_our_modules_import_no_circle(tmp_path):
    """No import circle among scripts/ and stages/ (lazy imports count); broken once on purpose: two
    modules that import each other, one inside a function, as errors.py once reached measure.py."""
    assert stage_deps.circles() == []
    for top in ("scripts", "stages"):
        (tmp_path / top).mkdir()
    (tmp_path / "scripts/__init__.py").write_text("")
    (tmp_path / "scripts/errors.py").write_text("def run():\n    from scripts.measure import peak\n")
    (tmp_path / "scripts/measure.py").write_text("from scripts.errors import run\n")
    assert stage_deps.circles(tmp_path) == [[Path("scripts/errors.py"), Path("scripts/measure.py")]]


def test_a_type_only_import_is_no_dependency_and_no_circle(tmp_path):
    """An import under `if TYPE_CHECKING:` never runs (layout.py names the snapshot record that way):
    it adds no code dep and closes no circle; the same import outside the block does both."""
    for top in ("scripts", "stages"):
        (tmp_path / top).mkdir()
    (tmp_path / "scripts/__init__.py").write_text("")
    (tmp_path / "scripts/layout.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from scripts.snapshot import Record\n"
    )
    (tmp_path / "scripts/snapshot.py").write_text("from scripts.layout import x\n")
    assert stage_deps.circles(tmp_path) == []
    assert Path("scripts/snapshot.py") not in stage_deps.imported(Path("scripts/layout.py"), tmp_path)
    (tmp_path / "scripts/layout.py").write_text("from scripts.snapshot import Record\n")
    assert stage_deps.circles(tmp_path) == [[Path("scripts/layout.py"), Path("scripts/snapshot.py")]]


def test_the_stage_harness_is_no_stage_dependency():
    """The harness (quiet output, one-line errors, time and memory recorded) changes no output, so an
    edit to it, or to the memory sampler or the log filter it runs, reruns no stage that does not itself
    compute with them. Broken once on purpose: followed, it makes them deps of every stage."""
    deps = {name: set(stage_deps.wanted_deps(stage)) for name, stage in STAGES.items()}
    harness = {str(stage_deps.HARNESS), "scripts/pipeline/measure.py", "scripts/pipeline/quiet.py"}
    assert not any(harness & d for name, d in deps.items() if name in ("fetch", "check_params")), deps
    assert "scripts/pipeline/measure.py" in deps["verify_tflite"]  # its latency loop is the stage's own code
    assert not any(str(stage_deps.HARNESS) in d for d in deps.values())
    followed = stage_deps.code_of(Path("stages/fetch.py")) | stage_deps.code_of(stage_deps.HARNESS)
    assert harness <= {str(p) for p in followed}


def test_the_profile_is_no_stage_dependency():
    """The parts' timing (scripts/pipeline/profile.py) changes no output either: every stage imports it
    (the snapshot's hashing is a part) and none depends on it. Followed, it would be a dep of all of them."""
    deps = {name: set(stage_deps.wanted_deps(stage)) for name, stage in STAGES.items()}
    assert not any(str(stage_deps.PROFILE) in d for d in deps.values())
    assert stage_deps.PROFILE in stage_deps.imported(Path("scripts/checkpoint/snapshot.py"))


def test_editing_the_release_code_reruns_no_verify_stage():
    """The verify stages hours long at clef-flash size depend on the reference records' module only, not
    on the release's reader or signing: an edit there reruns the release, not the graphs' checks."""
    release_only = {"scripts/release/reader.py", "scripts/release/signing.py", "scripts/release/builder.py"}
    for name in ("verify_tflite", "verify_pair", "verify_gpu_row", "verify_gpu_pair"):
        deps = {d for d in STAGES[name]["deps"] if isinstance(d, str)}
        assert "scripts/release/references.py" in deps or name.startswith("verify_gpu"), name
        assert not deps & release_only, f"{name} depends on {sorted(deps & release_only)}"
    assert release_only <= set(STAGES["release"]["deps"])


def params_sections_read(entry: Path) -> set[str]:
    """The sections a stage asks scripts.pipeline.params.load for (a literal list in its entry point). The
    pass/fail bounds it reads besides (its memory budget, its thresholds) are not declared: see below."""
    sections = set()
    for node in ast.walk(ast.parse(entry.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and node.args:
            if isinstance(node.args[0], ast.List):
                sections |= {e.value for e in node.args[0].elts}
    return sections


def declares_whole_params_file(stage: dict) -> bool:
    return any(isinstance(p, dict) and "params.yaml" in p and not p["params.yaml"] for p in stage.get("params", []))


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_declares_the_params_it_reads(name):
    stage = STAGES[name]
    entry = ROOT / Path(*stage["cmd"].split("python -m ", 1)[1].split()[0].split(".")).with_suffix(".py")
    if declares_whole_params_file(stage):  # the release records all of params.yaml, so depends on all of it
        return
    assert params_sections_read(entry) == set(stage.get("params", []))


@pytest.mark.parametrize("name", sorted(STAGES))
def test_no_stage_declares_a_bound(name):
    """A bound (scripts/pipeline/bounds.py) decides pass or fail: declared, a new value would rerun the stage
    and rewrite outputs computed under the old one. check_params holds the records to it instead."""
    declared = [p for p in STAGES[name].get("params", []) if isinstance(p, str)]
    assert not [p for p in declared if bounds.is_bound(p)], name


def test_every_bound_is_held_to_a_record():
    """Each bound key names a params.yaml key, and each figure check_params holds names one of them."""
    params = load_params(ROOT)
    for key in bounds.KEYS:
        assert bounds.value(params, key) is not None, key
    assert all(bounds.is_bound(b.key) for b in bounds.FIGURES) and all(bounds.is_bound(k) for _, k in bounds.CONTROLLED)


def test_every_stage_waits_for_the_params_checks():
    """DVC removes a stage's outputs just before it runs it, so the checks must come first: every stage
    depends on check_params's output, every stage that reads lengths or pairs (declared, iterated with
    foreach, or the whole file) on check_lengths's too; both outputs are persistent (not removed)."""
    raw = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    checked = {str(layout.PARAMS_CHECKED): "check_params", str(layout.LENGTHS_CHECKED): "check_lengths"}
    for path, stage in checked.items():
        assert STAGES[stage]["outs"] == [{path: {"persist": True}}], stage
    for name, stage in STAGES.items():
        if name == "check_params":
            continue
        assert str(layout.PARAMS_CHECKED) in stage["deps"], name
        reads = {p for p in stage.get("params", []) if isinstance(p, str)} | {raw[name].get("foreach", "").strip("${}")}
        if name != "check_lengths" and (reads & {"lengths", "pairs"} or declares_whole_params_file(stage)):
            assert str(layout.LENGTHS_CHECKED) in stage["deps"], name


@pytest.mark.parametrize(
    "path, stage",
    [
        ("results/metrics/tflite_L64.json", "verify_tflite"),
        ("results/metrics/gpu_pair_P64_S64.json", "verify_gpu_pair"),
        ("results/metrics/kernel_bench.json", "kernel_bench"),
        ("results/metrics/kernel.json", "verify_kernel"),
        ("artifacts/pairs/pair_P8_S4.tflite", "export_pair"),
        ("results/checked/lengths.txt", "check_lengths"),
        ("results/metrics/nothing.json", "the stage that writes it"),
    ],
)
def test_a_missing_record_names_the_stage_dvc_yaml_says_writes_it(path, stage):
    assert layout.producer_of(path) == stage


def test_link_cache_configured():
    """A 19 GB snapshot must not be copied into DVC's cache: links first, copy last. Hardlink leads
    because DVC commits a stage's new output by hardlink only when hardlink is the first type."""
    config = (ROOT / ".dvc" / "config").read_text()
    assert 'type = "hardlink,reflink,symlink,copy"' in config


def load_params(repo: Path) -> dict:
    return yaml.safe_load((repo / "params.yaml").read_text())


def instances(name: str, params: dict) -> list[str]:
    """A stage's instance names: foreach over a list of values -> name@value; of mappings -> name@index."""
    raw = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][name]
    if "foreach" not in raw:
        return [name]
    items = params[raw["foreach"].strip("${}")]
    return [f"{name}@{i if isinstance(item, dict) else item}" for i, item in enumerate(items)]


def reading(section: str, params: dict) -> list[str]:
    """Every stage instance that reads a params.yaml section (by name, or by declaring the whole file)."""
    return sorted(
        i
        for n, st in STAGES.items()
        if section in st.get("params", []) or declares_whole_params_file(st)
        for i in instances(n, params)
    )


def test_pipeline_end_to_end(pipeline):
    repo, first = pipeline["repo"], pipeline["log"]
    for name in STAGES:
        assert f"Running stage '{name}" in first, first  # foreach stages run as name@item
    lines = (first + pipeline["stderr"]).replace("\r", "\n").splitlines()
    noise = [
        line
        for line in lines
        if quiet.NOISE.match(line.encode()) or re.search(r"\w+Warning: ", line) or "[START]" in line
    ]
    assert not noise, f"third-party log lines in the repro's output: {noise[:5]}"
    assert (repo / "results" / "stack.json").is_file()
    cached = {p.stat().st_ino for p in (repo / ".dvc" / "cache").rglob("*") if p.is_file()}
    shards = list((repo / "hf").rglob("*.safetensors"))
    assert shards and not any(p.stat().st_ino in cached for p in shards), "hf/ shares its bytes with DVC's cache"
    written = [f for top in ("results", "artifacts") for f in (repo / top).rglob("*") if f.is_file()]
    ordinary = atomic.ordinary_mode()  # 0644 under the usual umask; DVC's links are 0444
    unreadable = [str(f) for f in written if f.stat().st_mode & 0o444 != 0o444 or f.stat().st_mode & 0o777 & ~ordinary]
    assert written and not unreadable, unreadable

    params = load_params(repo)
    for n in params["lengths"]:
        doc = json.loads((repo / "results" / f"tflite_L{n}.json").read_text())
        assert doc["passed"] and doc["metadata"]["L"] == n and (repo / "artifacts/rows" / f"row_L{n}.tflite").is_file()
    for pair in params["pairs"]:
        doc = json.loads((repo / "results" / f"pair_P{pair['prefix']}_S{pair['suffix']}.json").read_text())
        assert doc["summary"]["passed"] and set(doc["census"]["signatures"]) == {"prefix", "suffix"}
    # every row and pair signature on the GPU accelerator alone: fully accelerated, fp32 exact, fp16 finite,
    # mixed shown by its probe and its ratio to the floor recorded, every layer of the tiny checkpoint
    gpu = [layout.gpu_name(n) for n in params["lengths"]] + [
        layout.gpu_name(prefix=q["prefix"], suffix=q["suffix"]) for q in params["pairs"]
    ]
    for name in gpu:
        doc = json.loads((repo / layout.gpu_result_path(name)).read_text())
        assert doc["passed"] and doc["fully_accelerated"] and doc["all_finite"], name
        curves = doc["positions"]  # the picture's: every mode's figure at each position of one record
        assert max(curves["fp32_vs_torch"]) <= doc["fp32_max_rel_per_position_vs_torch"], name
        assert doc["fp32_max_rel_vs_torch"] <= doc["threshold_fp32"] and doc["floor_max_rel_vs_f64"] > 0, name
        assert doc["device"]["adapter"] and {r["mode"] for r in doc["rows"]} == {"fp32", "fp16", "mixed"}, name
        mixed = doc["modes"]["mixed"]
        assert mixed["probe"]["arithmetic"] == "mixed" and mixed["fully_accelerated"], name
        assert mixed["over_floor"] > 0 and mixed["over_floor_per_position"] > 0, name
        assert doc["layers_checked"] == doc["layers"], name
    assert {
        s
        for name in gpu[len(params["lengths"]) :]
        for s in json.loads((repo / layout.gpu_result_path(name)).read_text())["signatures"]
    } == {"prefix", "suffix"}
    # every signature of every graph timed by litert-benchmark: percentiles in order; a row graph has every
    # op on the CPU accelerator, a pair's delegation is recorded as the tool reports it (not all: docs/release.md)
    latency = json.loads((repo / layout.result_path("latency")).read_text())
    signatures = len(params["lengths"]) + 2 * len(params["pairs"])
    assert latency["tool"] == "litert-benchmark" and len(latency["rows"]) == signatures
    assert all(0 < r["p5_ms"] <= r["median_ms"] <= r["p95_ms"] for r in latency["rows"])
    assert all(r["fully_accelerated"] is True for r in latency["rows"] if r["kind"] == "row")
    assert all(isinstance(r["fully_accelerated"], bool) for r in latency["rows"])
    # a pair stores its weights once: about the size of one row graph, not two
    small = min(params["pairs"], key=lambda q: q["prefix"])
    pair_bytes = (repo / "artifacts/pairs" / f"pair_P{small['prefix']}_S{small['suffix']}.tflite").stat().st_size
    row_bytes = (repo / "artifacts/rows" / f"row_L{min(params['lengths'])}.tflite").stat().st_size
    assert pair_bytes < 1.25 * row_bytes, (pair_bytes, row_bytes)

    second = dvc(repo, "repro")
    assert "Data and pipelines are up to date." in second and "Running stage" not in second, second

    # a rebuild from the same inputs is byte-identical: a row graph, and the release's every file and tarball
    row = repo / "artifacts/rows" / f"row_L{params['lengths'][0]}.tflite"
    manifest = json.loads((repo / "artifacts/release/manifest.json").read_text())
    tarball = next((repo / "artifacts/dist").glob("*" + builder.TARBALL_SUFFIX))
    before = hashlib.sha256(row.read_bytes()).hexdigest()
    dvc(repo, "repro", "--force", "--single-item", f"export@{params['lengths'][0]}")
    dvc(repo, "repro", "--force", "--single-item", "release")
    assert hashlib.sha256(row.read_bytes()).hexdigest() == before
    again = json.loads((repo / "artifacts/release/manifest.json").read_text())
    assert again["files"] == manifest["files"] and again["artifacts"].keys() == manifest["artifacts"].keys()
    assert [m.name for m in tarfile_members(tarball)] == [
        m.name for m in tarfile_members(next((repo / "artifacts/dist").glob("*" + builder.TARBALL_SUFFIX)))
    ]

    # a form change: exactly the stages that read the form are stale, nothing upstream
    params["form"] = "R32+sp+ec+dd+vs6"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    changed = json.loads(dvc(repo, "status", "--json"))
    assert len(reading("form", params)) >= 2 and sorted(changed) == reading("form", params), changed

    # a revision change is read by fetch (and recorded by the release); the tiny snapshot it writes is
    # the same, so nothing between them reruns
    params["form"] = "R64+sp+ec+dd+vs6"
    params["model"]["revision"] = "0" * 40
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    third = dvc(repo, "repro")
    ran = sorted(line.split("'")[1] for line in third.splitlines() if line.startswith("Running stage"))
    assert ran == reading("model", params), third
    git(repo, "checkout", "--", "params.yaml")  # back to the committed params: a clean tree again
    dvc(repo, "repro")
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    # what a killed export or an interrupted write leaves behind is not a change (.dvcignore)
    leftovers = [
        repo / "artifacts/pairs/.pair_P64_S64.tflite.k1ll3d.raw",
        repo / "artifacts/rows/.row_L64.tflite.x.partial",
    ]
    for f in leftovers:
        f.write_bytes(b"")
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    for f in leftovers:
        f.unlink()


def outputs(repo: Path) -> dict[str, str]:
    """Every file the pipeline wrote (hf/, artifacts/, results/, not the run records) -> sha256."""
    return {
        str(f.relative_to(repo)): hashlib.sha256(f.read_bytes()).hexdigest()
        for top in ("hf", "artifacts", "results")
        for f in sorted((repo / top).rglob("*"))
        if f.is_file() and layout.RUNTIME.name not in f.relative_to(repo).parts
    }


def section(name: str, key: str, value):
    return lambda p: p[name].update({key: value})


# Issue 15: bad params.yaml edits that used to start work (or remove outputs) before being refused.
# case -> (edit of the committed params, what the one `error:` line must say)
BAD_PARAMS = {
    "1-length-beyond-context": (
        lambda p: p.update(lengths=[64, 128, 256, 8192]),
        "length 8192 is above the model's max_position_embeddings (4096)",
    ),
    "1-huge-length": (
        lambda p: p.update(lengths=[100000]),
        "length 100000 is above the model's max_position_embeddings",
    ),
    "2-pair-extra-key": (
        lambda p: p["pairs"].append({"prefix": 32, "suffix": 32, "note": "x"}),
        "must be a mapping with exactly prefix and suffix",
    ),
    "2-pair-fractional": (
        lambda p: p["pairs"].append({"prefix": 64.5, "suffix": 64}),
        "prefix is not a positive integer",
    ),
    "2-pair-beyond-context": (
        lambda p: p["pairs"].append({"prefix": 4096, "suffix": 64}),
        "prefix + suffix = 4160 is above the model's max_position_embeddings",
    ),
    "3-loop-form": (lambda p: p.update(form="loop"), "form loop cannot be exported"),
    "3-cumsum-form": (lambda p: p.update(form="R64+sp+ec+vs6"), "cumsum lowers to CUMSUM"),
    "4-threshold-text": (
        section("verify_tflite", "max_rel_vs_torch", "x"),
        "verify_tflite.max_rel_vs_torch 'x' is not a positive number",
    ),
    "4-threshold-trailing": (
        section("verify_kernel", "max_rel_vs_f64", "1e-5x"),
        "max_rel_vs_f64 '1e-5x' is not a positive",
    ),
    "4-threshold-negative": (
        section("verify_pair", "max_rel_vs_row", -1e-4),
        "max_rel_vs_row -0.0001 is not a positive",
    ),
    "4-threshold-nan": (
        section("verify_model", "max_rel_causality", float("nan")),
        "max_rel_causality nan is not a positive",
    ),
    "4-latency-repeats-zero": (
        section("verify_tflite", "latency_repeats", 0),
        "latency_repeats 0 is not an integer >= 1",
    ),
    "4-bench-repeats-zero": (section("kernel_bench", "repeats", 0), "kernel_bench.repeats 0 is not an integer >= 1"),
    "5-typo-section": (lambda p: p.update(lenghts=[64]), "unknown section lenghts; did you mean lengths?"),
    "5-typo-key": (
        lambda p: p["verify_tflite"].update(latency_repeat=p["verify_tflite"].pop("latency_repeats")),
        "unknown key verify_tflite.latency_repeat; did you mean latency_repeats?",
    ),
    "9-host-weights": (
        section("release", "host_weights", "foo"),
        "release.host_weights 'foo' is not one of include, reference",
    ),
    "9-weights": (lambda p: p.update(weights="int3"), "weights 'int3' is not one of fp32, fp16, int8, int4"),
    # Issue 52: blockwise int8 (the GPU accelerator aborts on it), a block that is not one of the four, and
    # blockwise int4 in the pipeline (the GPU accelerator aborts on it; no exact CPU form for the checks)
    "52-blockwise-int8": (lambda p: p.update(weights="int8b32"), "weights int8b32: blockwise int8 is refused"),
    "52-block-size": (lambda p: p.update(weights="int4b48"), "block 48 is not one of 32, 64, 128, 256"),
    "52-blockwise-int4": (
        lambda p: p.update(weights="int4b32"),
        "weights int4b32: blockwise int4 aborts LiteRT's GPU accelerator",
    ),
    "52-host-precision": (
        section("release", "host_weights_precision", "fp16"),
        "release.host_weights_precision 'fp16': the host tables are bf16, int8 or int4",
    ),
    "9-model-source": (section("model", "source", "local"), "model.source 'local' is not one of tiny, synthetic, hub"),
    "9-model-revision": (section("model", "revision", "main"), "model.revision 'main' is not a full 40-hex commit id"),
    # Issue 37: a form spelt another way (DVC would rerun every stage that reads it), a length or pair too short
    # for the checks' records (verify_model refused it after removing its outputs), and an integer written as
    # a float, which DVC compares equal to the integer (check_params is rerun by the file's text, a dep).
    "37-form-spelling": (lambda p: p.update(form="R64+ec+sp+dd+vs6"), "did you mean R64+sp+ec+dd+vs6?"),
    "37-form-leading-zeros": (lambda p: p.update(form="R64+sp+ec+dd+vs006 "), "did you mean R64+sp+ec+dd+vs6?"),
    "37-length-too-short": (
        lambda p: p["lengths"].append(3),
        "length 3 is too short for the checks: the causality record (L//2 + 3) holds 4 tokens, outside 1..3",
    ),
    "37-pair-too-short": (
        lambda p: p["pairs"].append({"prefix": 1, "suffix": 16}),
        "is too short for the checks: a chaining prefix (1, P//2, P) holds 0 tokens",
    ),
    "37-integer-as-float": (
        lambda p: p["verify_tflite"].update(latency_repeats=float(p["verify_tflite"]["latency_repeats"])),
        "verify_tflite.latency_repeats 7.0 is not an integer >= 1",
    ),
}

# Issue 37: a pass/fail bound that a figure the run recorded already fails (no stage declares a bound:
# scripts/pipeline/bounds.py). Refused by check_params against the records, so only after a run.
BAD_BOUNDS = {
    "37-memory-budget": (section("memory", "overhead_gib", 0.03), "params.yaml memory: a bound of 0.0"),
    "37-stack-rss-budget": (section("stack", "rss_overhead_gib", 0.05), "params.yaml stack: a bound of"),
    "37-threshold-under-a-record": (
        section("verify_tflite", "max_rel_per_position_vs_torch", 1e-9),
        "params.yaml verify_tflite.max_rel_per_position_vs_torch: a bound of 1e-09 fails max_rel_per_position",
    ),
    "37-control-margin": (
        section("controls", "min_over_threshold", 1e9),
        "params.yaml controls.min_over_threshold x verify_",
    ),
}


@pytest.mark.parametrize("case", sorted({**BAD_PARAMS, **BAD_BOUNDS}))
def test_bad_params_refused_before_any_output_is_removed(pipeline, case):
    """`dvc repro` after a bad edit: exit non-zero, exactly one `error:` line naming the problem, and every
    file the last good run wrote still there, byte for byte (check_params runs before any stage can
    remove an output; check_lengths before any stage that reads lengths or pairs). Mended params rerun
    nothing but the checks."""
    repo = pipeline["repo"]
    edit, fragment = {**BAD_PARAMS, **BAD_BOUNDS}[case]
    before = outputs(repo)
    params = load_params(repo)
    edit(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    try:
        proc = dvc_run(repo, "repro")
        said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")]
        assert proc.returncode != 0 and len(said) == 1 and fragment in said[0], (
            proc.returncode,
            said,
            proc.stderr[-2000:],
        )
        assert "Running stage 'check_" in proc.stdout and not set(re.findall(r"Running stage '(\w+)", proc.stdout)) - {
            "check_params",
            "check_lengths",
        }, proc.stdout
        assert outputs(repo) == before
    finally:
        git(repo, "checkout", "--", "params.yaml")
    ran = set(re.findall(r"Running stage '(\w+)", dvc(repo, "repro")))
    assert ran <= {"check_params"} and "Data and pipelines are up to date." in dvc(repo, "status")
    assert outputs(repo) == before


def test_a_bound_every_record_meets_reruns_no_stage(pipeline):
    """Bounds decide pass or fail and compute nothing: tightened or loosened within what every record
    meets, `dvc repro` reruns check_params and the release (which records all of params.yaml) and no
    stage that converts or checks, and every output but the release's stays byte for byte."""
    repo = pipeline["repo"]
    before = outputs(repo)
    params = load_params(repo)
    params["memory"]["overhead_gib"] = 3.5
    params["stack"]["rss_factor"] = 1.5
    params["controls"]["min_over_threshold"] = 50
    params["verify_pair"]["max_rel_vs_row"] = 2.0e-4
    params["verify_tflite"]["max_rel_vs_torch"] = 5.0e-5
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    try:
        proc = dvc_run(repo, "repro")
        ran = set(re.findall(r"Running stage '(\w+)", proc.stdout))
        assert proc.returncode == 0 and ran == {"check_params", "release"}, (
            ran,
            proc.stdout[-2000:] + proc.stderr[-2000:],
        )
        kept = {k: v for k, v in outputs(repo).items() if not k.startswith(("artifacts/release", "artifacts/dist"))}
        assert kept == {k: v for k, v in before.items() if k in kept} and set(kept) <= set(before)
    finally:
        git(repo, "checkout", "--", "params.yaml")
        dvc(repo, "repro")


def test_a_shard_changed_in_place_is_found_named_and_replaced(pipeline):
    """One byte of a shard under hf/ flipped in place: DVC sees hf/ modified (it is not in DVC's cache, so the
    edit cannot reach a cached copy), `dvc repro` reruns fetch alone, which names the shard and replaces it with
    the snapshot's bytes; nothing downstream reruns and the cache holds no copy of the changed bytes."""
    repo = pipeline["repo"]
    before = outputs(repo)
    shard = sorted((repo / "hf").rglob("*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    changed = hashlib.sha256(shard.read_bytes()).hexdigest()
    assert "modified:           hf" in dvc(repo, "status")
    proc = dvc_run(repo, "repro")
    ran = set(re.findall(r"Running stage '(\w+)", proc.stdout))
    assert proc.returncode == 0 and ran == {"fetch"}, (ran, proc.stdout[-2000:] + proc.stderr[-2000:])
    assert f"{shard.name} in hf/ differed from the snapshot fetched now" in proc.stdout, proc.stdout[-2000:]
    assert outputs(repo) == before and "Data and pipelines are up to date." in dvc(repo, "status")
    cached = [
        p for p in (repo / ".dvc" / "cache").rglob("*") if p.is_file() and p.stat().st_size == shard.stat().st_size
    ]
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() != changed for p in cached)


# Refused by DVC itself while it reads dvc.yaml, before any stage runs (the README's "Bad input" quotes these).
DVC_REFUSES = {
    "2-pair-missing-key": (
        lambda text: text.replace("- {prefix: 64, suffix: 64}", "- {prefix: 64}"),
        "Could not find 'item.suffix'",
    ),
    "yaml-syntax": (
        lambda text: text.replace("lengths: [64, 256]", "lengths: [64, 256"),
        "YAML file structure is corrupted",
    ),
    # Issue 37: DVC resolves `foreach: ${lengths}` before any stage, so these name the key, not params.yaml.
    "37-empty-params": (
        lambda text: "",
        "failed to parse 'stages.export.foreach' in 'dvc.yaml': Could not find 'lengths'",
    ),
    "37-lengths-a-string": (
        lambda text: text.replace("lengths: [64, 256]", 'lengths: "64, 256"'),
        "failed to resolve 'stages.export.foreach' in 'dvc.yaml': expected list/dictionary, got str",
    ),
}


@pytest.mark.parametrize("case", sorted(DVC_REFUSES))
def test_dvc_refuses_what_it_cannot_parse(pipeline, case):
    repo = pipeline["repo"]
    edit, fragment = DVC_REFUSES[case]
    before = outputs(repo)
    text = (repo / "params.yaml").read_text()
    assert edit(text) != text, "the edit no longer matches the committed params.yaml"
    (repo / "params.yaml").write_text(edit(text))
    try:
        proc = dvc_run(repo, "repro")
        assert proc.returncode != 0 and fragment in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "Running stage" not in proc.stdout and outputs(repo) == before
    finally:
        git(repo, "checkout", "--", "params.yaml")


def tarfile_members(path: Path):
    with builder.open_tarball(path) as tar:
        return tar.getmembers()


def test_metrics_and_plots(pipeline, tmp_path):
    """`dvc metrics show` tabulates one row per check with shared columns; `dvc plots show` renders
    error and latency against L from the release's by-length tables."""
    repo = pipeline["repo"]
    shown = json.loads(dvc(repo, "metrics", "show", "--json"))
    files = next(iter(shown.values()))["data"]
    rows = {Path(path).stem: entry["data"] for path, entry in files.items()}
    params = load_params(repo)
    for check in (
        ["kernel", "layers", "model"]
        + [f"tflite_L{n}" for n in params["lengths"]]
        + [f"pair_P{q['prefix']}_S{q['suffix']}" for q in params["pairs"]]
        + [layout.gpu_name(n) for n in params["lengths"]]
        + [layout.gpu_name(prefix=q["prefix"], suffix=q["suffix"]) for q in params["pairs"]]
    ):
        assert rows[check]["passed"] is True and 0 <= rows[check]["max_rel"] <= rows[check]["threshold"], check
        assert rows[check]["max_rel_per_position"] <= rows[check]["threshold_per_position"], check
    # each check's fault (scripts/checks/controls.py) broke its bound by the factor params.yaml asks for
    controlled = (
        ["kernel", "layers", "model"]
        + [f"tflite_L{n}" for n in params["lengths"] if controls.memory_cut_applies(params["form"], n)]
        + [f"pair_P{q['prefix']}_S{q['suffix']}" for q in params["pairs"]]
    )
    for check in controlled:
        assert rows[check]["control_over_threshold"] >= params["controls"]["min_over_threshold"], check
    for n in params["lengths"]:
        assert {"ops_per_gdn_layer", "bytes", "torch_over_litert", "litert_ms"} <= set(rows[f"tflite_L{n}"])
    assert rows["export_bench"]["gdn_ops_stock_over_form"] > 1
    table = dvc(repo, "metrics", "show")
    assert "max_rel" in table.splitlines()[0] and len(table.splitlines()[0]) < 600, "metrics table is not compact"

    out = tmp_path / "plots"
    page = subprocess.run(  # as `make env` writes it (.dvc/config's plots.html_template; git-ignored)
        [sys.executable, "-m", "scripts.pipeline.plots_page"], cwd=repo, capture_output=True, text=True
    )
    assert page.returncode == 0, page.stderr
    dvc(repo, "plots", "show", "--out", str(out))
    html = (out / "index.html").read_text()
    for title in ("max relative error per row graph", "interpreter time per record", "pair chaining"):
        assert title in html, title
    assert not re.search(r"<script[^>]*\bsrc\s*=", html) and "window.vegaEmbed" in html, "plots need the network"
    import vl_convert  # the libraries the page holds, run here: every plot's spec renders offline

    specs = json.loads(dvc(repo, "plots", "show", "--json"))["data"]
    assert len(specs) == 3
    for name, items in specs.items():
        assert all(vl_convert.vegalite_to_svg(it["content"]).startswith("<svg") for it in items), name
    by_length = json.loads((repo / "results/plots/rows.json").read_text())
    assert [r["L"] for r in by_length] == sorted(params["lengths"]) and all(r["litert_ms"] > 0 for r in by_length)


def test_readme_tables_render_from_the_run(pipeline):
    """`make release` ends by rewriting the README's tables from the run: every check passed there. (The
    benchmark's tables come from the committed results/bench.json, as in a fresh checkout.)"""
    repo = pipeline["repo"]
    benches = (layout.BENCH, layout.result_path("weights"))  # make real-width's and make weights-bench's
    for path in benches:
        shutil.copy2(ROOT / path, repo / path)
    try:
        text, _ = readme.render((ROOT / "README.md").read_text(), repo)
    finally:
        for path in benches:
            (repo / path).unlink()  # the session's repo is shared: leave it as the run left it
    params = load_params(repo)
    for n in params["lengths"]:
        assert (
            f"| row L={n}: LiteRT vs torch | yes |" in text
            and f"| row L={n} on the GPU accelerator, fp32 | yes |" in text
        )
    for q in params["pairs"]:
        assert f"| pair P={q['prefix']} S={q['suffix']}: chaining vs row | yes |" in text
    assert "**no**" not in text and "commit " in text


def test_model_artifacts_declared(pipeline):
    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["artifacts"]
    assert declared and all(a["type"] == "model" and a["desc"] and a["labels"] for a in declared.values())
    for a in declared.values():
        assert (pipeline["repo"] / a["path"]).is_dir(), a["path"]


RELEASE_TAG = "clef-flash-litert@v0.1.0"  # a version of dvc.yaml's artifact, in GTO's tag format


@pytest.fixture(scope="module")
def pulled_clone(pipeline, tmp_path_factory) -> Path:
    """The pipeline's repo pushed to an S3 remote (an S3-API server on loopback, tests/s3_server.py),
    cloned with git and pulled with `clef pull`, as a team shares a signed release."""
    repo = pipeline["repo"]
    with s3_server("team") as endpoint:
        add_s3_remote(repo, dvc, "team", "s3://team/clef-litert", endpoint)
        git(repo, "add", "-A")  # the remote's config and the dvc.lock of what is pushed, as a team commits them
        git(repo, "commit", "-qm", "release and remote")
        git(repo, "tag", "-a", RELEASE_TAG, "-m", "the release, for `dvc artifacts get`")  # as the README says
        dvc(repo, "push")
        clone = tmp_path_factory.mktemp("clone") / "repo"
        git(repo.parent, "clone", "-q", str(repo), str(clone))
        git(clone, "config", "user.name", "test")  # `dvc exp run` commits experiments
        git(clone, "config", "user.email", "test@localhost")
        set_credentials(clone, dvc, "team")
        proc = clef(clone, "pull")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield clone


def test_remote_round_trip(pipeline, pulled_clone):
    """What one team member pushes, another pulls byte for byte, and it verifies with the team's key."""
    source, clone = pipeline["repo"] / "artifacts/release", pulled_clone / "artifacts/release"
    files = json.loads((source / "manifest.json").read_text())["files"]
    for name, entry in files.items():
        assert hashlib.sha256((clone / name).read_bytes()).hexdigest() == entry["sha256"], name
    assert (clone / "model.sig").read_bytes() == (source / "model.sig").read_bytes()
    assert list((pulled_clone / "artifacts/dist").glob("*" + builder.TARBALL_SUFFIX))
    assert "Data and pipelines are up to date." in dvc(pulled_clone, "status")
    key = str(pipeline["public_key"])
    proc = clef(pulled_clone, "verify", "artifacts/release", "--key", key, "--require-signature")
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout + proc.stderr
    assert "ok   signature: model.sig verifies with key" in proc.stdout


def test_a_fresh_clone_compares_and_gets_the_release_through_the_remote(pipeline, pulled_clone, tmp_path):
    """A teammate's fresh clone, pulled nothing, rebuilt nothing: `dvc metrics diff` against the pushed commit
    loads every metrics record from the remote, `dvc exp show` lists that commit's metrics, and `dvc artifacts
    get` downloads the tagged release byte for byte. The remote holds no shard of hf/ (the hub does)."""
    repo, pushed = pipeline["repo"], git(pulled_clone, "rev-parse", "HEAD").strip()
    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(repo), str(fresh))
    set_credentials(fresh, dvc, "team")
    records = {
        f"results/metrics/{p.name}": json.loads(p.read_text()) for p in (repo / "results/metrics").glob("*.json")
    }
    proc = dvc_run(fresh, "metrics", "diff", pushed, "--all", "--json")
    assert proc.returncode == 0 and "failed to load" not in proc.stderr, proc.stderr[-3000:]
    diff = json.loads(proc.stdout)
    assert set(diff) == set(records)
    for path, row in records.items():
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert numbers and {k: diff[path][k]["old"] for k in numbers} == numbers, path

    shown = {e["rev"]: e for e in json.loads(dvc(fresh, "exp", "show", "--json"))}
    assert set(shown[pushed]["data"]["metrics"]) == set(records)

    out = tmp_path / "release"
    assert "Downloaded" in dvc(fresh, "artifacts", "get", ".", "clef-flash-litert", "-o", str(out))
    manifest = json.loads((repo / "artifacts/release/manifest.json").read_text())
    for name, entry in manifest["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == entry["sha256"], name

    keys = remote_keys(fresh)
    shards = [p for p in (repo / "hf").rglob("*.safetensors")]
    assert shards and keys
    for shard in shards:
        md5 = hashlib.md5(shard.read_bytes()).hexdigest()
        assert f"files/md5/{md5[:2]}/{md5[2:]}" not in keys, f"{shard.name} was pushed"


def remote_keys(clone: Path) -> set[str]:
    """Every object key under the clone's default DVC remote (the loopback S3), relative to its path."""
    import boto3

    url = dvc(clone, "remote", "default").strip()
    config = {
        k: v for k, v in (line.split("=", 1) for line in dvc(clone, "config", "--list").splitlines() if "=" in line)
    }
    bucket, _, prefix = config[f"remote.{url}.url"].removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=config[f"remote.{url}.endpointurl"],
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["access_key_id"],
        aws_secret_access_key=CREDENTIALS["secret_access_key"],
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"].removeprefix(prefix + "/") for page in pages for o in page.get("Contents", [])}


def test_form_and_weights_overrides_reach_every_stage_that_reads_them(pulled_clone):
    """`dvc exp run -S form=... -S weights=int4` (on one length and one pair, to stay fast, and the `files`
    release layout): every stage that reads the form reruns with it and records it in what it writes, and
    int4 weights (read by the FULLY_CONNECTED itself; int8 takes the same path with other codes) pass every
    check they meet: the graphs hold int4 weights and say so, the conversion error of their exact form is
    within today's bounds, the CPU's dynamic kernels are within theirs, the GPU accelerator runs every
    signature whole in every mode with fp32 within today's bound, and the release verifies. (One run for
    both: each exp run of the pipeline is minutes.)"""
    repo, form = pulled_clone, "R32+sp+ec+dd+vs6"
    out = dvc(
        repo,
        "exp",
        "run",
        "--name",
        "r32",
        "-S",
        f"form={form}",
        "-S",
        "lengths=[64]",
        "-S",
        "pairs=[{prefix: 64, suffix: 64}]",
        "-S",
        "release.layout=files",  # the other layout, end to end: a .tflite per graph
        "-S",
        "weights=int4",
    )
    params = load_params(repo)
    assert params["form"] == form and params["lengths"] == [64]
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    for stage in reading("form", params):
        assert f"Running stage '{stage}'" in out, (stage, out[-3000:])
        assert lock[stage]["params"]["params.yaml"]["form"] == form, stage
        if stage != "check_params":  # its output is constant by design: it says only that the params passed
            assert any(records_form(repo / o["path"], form) for o in lock[stage]["outs"]), (
                f"{stage} does not record {form}"
            )
    weighed = reading("weights", params)
    assert {w.split("@")[0] for w in weighed} == {
        "check_params",  # the schema: it reads every key of params.yaml
        "export",
        "export_pair",
        "verify_tflite",
        "verify_pair",
        "verify_gpu_row",
        "verify_gpu_pair",
        "bundle",
        "release",
    }, "only the graphs, their checks and what packages them depend on the weights' precision"
    for stage in weighed:
        assert lock[stage]["params"]["params.yaml"]["weights"] == "int4", stage
    row = repo / "artifacts/rows/row_L64.tflite"
    assert tflite_file.read_metadata(row)["weights"] == "int4"
    assert set(tflite_file.census(row)["fully_connected_weights"]) <= {"INT4", "FLOAT32"}
    assert "DEQUANTIZE" not in tflite_file.census(row)["ops"], "the FULLY_CONNECTED reads the int4 weights itself"
    checked = json.loads((repo / "results/tflite_L64.json").read_text())
    assert checked["passed"] and checked["max_rel_vs_torch"] <= checked["thresholds"]["rel_vs_torch"]
    assert checked["max_rel_vs_torch"] < 1e-3 * checked["max_rel_dynamic_kernels"], "exact form vs as stored"
    assert checked["max_rel_dynamic_kernels"] <= checked["thresholds"]["rel_dynamic_kernels"]
    assert checked["quantization_effect"]["max_rel_vs_unquantized_f64"] > 10 * checked["max_rel_vs_torch"]
    for name in ("gpu_row_L64", "gpu_pair_P64_S64"):
        gpu = json.loads((repo / f"results/gpu/{name}.json").read_text())
        assert gpu["passed"] and gpu["fully_accelerated"], (name, gpu["problems"])
        assert gpu["fp32_max_rel_vs_torch"] <= gpu["threshold_fp32"], name
    bundle_doc = json.loads((repo / "results/bundle.json").read_text())
    assert bundle_doc["passed"] and bundle_doc["gpu_not_checked_why"] is None, bundle_doc["problems"]
    manifest = json.loads((repo / "artifacts/release/manifest.json").read_text())
    assert manifest["weights"] == "int4" and manifest["name"].endswith("-int4")
    assert manifest["form"] == form and manifest["params"]["form"] == form
    assert manifest["layout"] == "files" and manifest["bundle"] is None
    assert {a["file"] for a in manifest["artifacts"].values()} == {"rows/row_L64.tflite", "pairs/pair_P64_S64.tflite"}
    for art in manifest["artifacts"].values():
        assert art["dvc_lock"]["md5"] == art["md5"], art["file"]  # the export stage's output, as packaged
    assert [p.name for p in (repo / "artifacts/dist").glob("*" + builder.TARBALL_SUFFIX)] == [
        manifest["name"] + builder.TARBALL_SUFFIX
    ]
    assert form in manifest["name"]
    shown = json.loads(dvc(repo, "exp", "show", "--json"))
    assert "r32" in json.dumps(shown) and form in json.dumps(shown)
    proc = clef(repo, "verify", "artifacts/release")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def records_form(path: Path, form: str) -> bool:
    """Whether an output says which form made it: a .tflite's metadata, a JSON's text, a directory's manifest."""
    if path.is_dir():
        return any(records_form(f, form) for f in path.rglob("*.json"))
    if path.suffix == ".tflite":
        return (tflite_file.read_metadata(path.read_bytes()) or {}).get("form") == form
    return path.suffix == ".json" and f'"{form}"' in path.read_text()
