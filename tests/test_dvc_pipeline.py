"""dvc.yaml is honest (every stage depends on all the code it runs and declares the params it reads),
and the whole pipeline runs on the embedded default in a temporary copy of the repo (the session's
`pipeline` fixture): a second run does nothing, a rebuild is byte-identical, a parameter change reruns
exactly the stages that read it, metrics and plots are what DVC users expect, a release survives a
round trip through a DVC remote, and `dvc exp run -S form=...` reaches every stage that reads the form."""
from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from scripts import controls, layout, tflite_file
from tests.conftest import ROOT, clef, dvc, git

STAGES = {name: st.get("do", st) for name, st in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()}


def local_imports(module_file: Path) -> set[str]:
    """Files under scripts/ and stages/ that `module_file` imports, transitively."""
    seen: set[str] = set()
    todo = [module_file]
    while todo:
        tree = ast.parse(todo.pop().read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                rel = Path(*name.split(".")).with_suffix(".py")
                if name.split(".")[0] in ("scripts", "stages") and (ROOT / rel).is_file() and str(rel) not in seen:
                    seen.add(str(rel))
                    todo.append(ROOT / rel)
    return seen


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_depends_on_all_its_code(name):
    stage = STAGES[name]
    module = stage["cmd"].split("python -m ", 1)[1].split()[0]
    entry = Path(*module.split(".")).with_suffix(".py")
    code = local_imports(ROOT / entry) | {str(entry)}
    deps = set(stage.get("deps", []))
    assert code <= deps, f"stage {name} runs code it does not depend on: {sorted(code - deps)}"


def params_sections_read(entry: Path) -> set[str]:
    """The sections a stage asks scripts.params.load for (a literal list in its entry point)."""
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
    return sorted(i for n, st in STAGES.items() if section in st.get("params", []) or declares_whole_params_file(st)
                  for i in instances(n, params))


def test_pipeline_end_to_end(pipeline):
    repo, first = pipeline["repo"], pipeline["log"]
    for name in STAGES:
        assert f"Running stage '{name}" in first, first  # foreach stages run as name@item
    assert (repo / "results" / "stack.json").is_file()
    cached = {p.stat().st_ino for p in (repo / ".dvc" / "cache").rglob("*") if p.is_file()}
    shards = list((repo / "hf").rglob("*.safetensors"))
    assert shards and all(p.stat().st_ino in cached for p in shards), "hf/ is a second copy of DVC's cache"

    params = load_params(repo)
    for n in params["lengths"]:
        doc = json.loads((repo / "results" / f"tflite_L{n}.json").read_text())
        assert doc["passed"] and doc["metadata"]["L"] == n and (repo / "artifacts/rows" / f"row_L{n}.tflite").is_file()
    for pair in params["pairs"]:
        doc = json.loads((repo / "results" / f"pair_P{pair['prefix']}_S{pair['suffix']}.json").read_text())
        assert doc["summary"]["passed"] and set(doc["census"]["signatures"]) == {"prefix", "suffix"}
    # every row and pair signature on the GPU accelerator alone: fully accelerated, fp32 exact, fp16 finite
    gpu = [layout.gpu_name(n) for n in params["lengths"]] + \
        [layout.gpu_name(prefix=q["prefix"], suffix=q["suffix"]) for q in params["pairs"]]
    for name in gpu:
        doc = json.loads((repo / layout.gpu_result_path(name)).read_text())
        assert doc["passed"] and doc["fully_accelerated"] and doc["all_finite"], name
        assert doc["fp32_max_rel_vs_torch"] <= doc["threshold_fp32"] and doc["floor_max_rel_vs_f64"] > 0, name
        assert doc["device"]["adapter"] and {r["mode"] for r in doc["rows"]} == {"fp32", "fp16"}, name
    assert {s for name in gpu[len(params["lengths"]):] for s in
            json.loads((repo / layout.gpu_result_path(name)).read_text())["signatures"]} == {"prefix", "suffix"}
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
    tarball = next((repo / "artifacts/dist").glob("*.tar.gz"))
    before = hashlib.sha256(row.read_bytes()).hexdigest()
    dvc(repo, "repro", "--force", "--single-item", f"export@{params['lengths'][0]}")
    dvc(repo, "repro", "--force", "--single-item", "release")
    assert hashlib.sha256(row.read_bytes()).hexdigest() == before
    again = json.loads((repo / "artifacts/release/manifest.json").read_text())
    assert again["files"] == manifest["files"] and again["artifacts"].keys() == manifest["artifacts"].keys()
    assert [m.name for m in tarfile_members(tarball)] == [m.name for m in tarfile_members(next((repo / "artifacts/dist").glob("*.tar.gz")))]

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
    leftovers = [repo / "artifacts/pairs/.pair_P64_S64.tflite.k1ll3d.raw", repo / "artifacts/rows/.row_L64.tflite.x.partial"]
    for f in leftovers:
        f.write_bytes(b"")
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    for f in leftovers:
        f.unlink()


def tarfile_members(path: Path):
    import tarfile

    with tarfile.open(path) as tar:
        return tar.getmembers()


def test_metrics_and_plots(pipeline, tmp_path):
    """`dvc metrics show` tabulates one row per check with shared columns; `dvc plots show` renders
    error and latency against L from the release's by-length tables."""
    repo = pipeline["repo"]
    shown = json.loads(dvc(repo, "metrics", "show", "--json"))
    files = next(iter(shown.values()))["data"]
    rows = {Path(path).stem: entry["data"] for path, entry in files.items()}
    params = load_params(repo)
    for check in ["kernel", "layers", "model"] + [f"tflite_L{n}" for n in params["lengths"]] + \
            [f"pair_P{q['prefix']}_S{q['suffix']}" for q in params["pairs"]] + \
            [layout.gpu_name(n) for n in params["lengths"]] + \
            [layout.gpu_name(prefix=q["prefix"], suffix=q["suffix"]) for q in params["pairs"]]:
        assert rows[check]["passed"] is True and 0 <= rows[check]["max_rel"] <= rows[check]["threshold"], check
        assert rows[check]["max_rel_per_position"] <= rows[check]["threshold_per_position"], check
    # each check's fault (scripts/controls.py) broke its bound by the factor params.yaml asks for
    controlled = ["kernel", "layers", "model"] + [f"tflite_L{n}" for n in params["lengths"] if controls.memory_cut_applies(params["form"], n)] + \
        [f"pair_P{q['prefix']}_S{q['suffix']}" for q in params["pairs"]]
    for check in controlled:
        assert rows[check]["control_over_threshold"] >= params["controls"]["min_over_threshold"], check
    for n in params["lengths"]:
        assert {"ops_per_gdn_layer", "bytes", "torch_over_litert", "litert_ms"} <= set(rows[f"tflite_L{n}"])
    assert rows["export_bench"]["gdn_ops_stock_over_form"] > 1
    table = dvc(repo, "metrics", "show")
    assert "max_rel" in table.splitlines()[0] and len(table.splitlines()[0]) < 600, "metrics table is not compact"

    out = tmp_path / "plots"
    dvc(repo, "plots", "show", "--out", str(out))
    html = (out / "index.html").read_text()
    for title in ("max relative error per row graph", "interpreter time per record", "pair chaining"):
        assert title in html, title
    by_length = json.loads((repo / "results/plots/rows.json").read_text())
    assert [r["L"] for r in by_length] == sorted(params["lengths"]) and all(r["litert_ms"] > 0 for r in by_length)


def test_model_artifacts_declared(pipeline):
    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["artifacts"]
    assert declared and all(a["type"] == "model" and a["desc"] and a["labels"] for a in declared.values())
    for a in declared.values():
        assert (pipeline["repo"] / a["path"]).is_dir(), a["path"]


@pytest.fixture(scope="module")
def pulled_clone(pipeline, tmp_path_factory) -> Path:
    """The pipeline's repo pushed to a local-directory DVC remote, cloned with git and pulled with dvc."""
    repo = pipeline["repo"]
    remote = tmp_path_factory.mktemp("remote")
    dvc(repo, "remote", "add", "--default", "team", str(remote))
    git(repo, "add", "-A")  # the remote's config and the dvc.lock of what is pushed, as a team commits them
    git(repo, "commit", "-qm", "release and remote")
    dvc(repo, "push")
    clone = tmp_path_factory.mktemp("clone") / "repo"
    git(repo.parent, "clone", "-q", str(repo), str(clone))
    git(clone, "config", "user.name", "test")  # `dvc exp run` commits experiments
    git(clone, "config", "user.email", "test@localhost")
    dvc(clone, "pull")
    return clone


def test_remote_round_trip(pipeline, pulled_clone):
    """What one team member pushes, another pulls byte for byte, and it verifies where it lands."""
    source, clone = pipeline["repo"] / "artifacts/release", pulled_clone / "artifacts/release"
    files = json.loads((source / "manifest.json").read_text())["files"]
    for name, entry in files.items():
        assert hashlib.sha256((clone / name).read_bytes()).hexdigest() == entry["sha256"], name
    assert list((pulled_clone / "artifacts/dist").glob("*.tar.gz"))
    assert "Data and pipelines are up to date." in dvc(pulled_clone, "status")
    proc = clef(pulled_clone, "verify", "artifacts/release")
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout + proc.stderr


def test_form_override_reaches_every_stage_that_reads_it(pulled_clone):
    """`dvc exp run -S form=...` (on one length and one pair, to stay fast): every stage that reads
    the form reruns with it and records it in what it writes."""
    repo, form = pulled_clone, "R32+sp+ec+dd+vs6"
    out = dvc(repo, "exp", "run", "--name", "r32", "-S", f"form={form}", "-S", "lengths=[64]",
              "-S", "pairs=[{prefix: 64, suffix: 64}]")
    params = load_params(repo)
    assert params["form"] == form and params["lengths"] == [64]
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    for stage in reading("form", params):
        assert f"Running stage '{stage}'" in out, (stage, out[-3000:])
        assert lock[stage]["params"]["params.yaml"]["form"] == form, stage
        assert any(records_form(repo / o["path"], form) for o in lock[stage]["outs"]), f"{stage} does not record {form}"
    manifest = json.loads((repo / "artifacts/release/manifest.json").read_text())
    assert manifest["form"] == form and manifest["params"]["form"] == form
    assert [p.name for p in (repo / "artifacts/dist").glob("*.tar.gz")] == [f"{manifest['name']}.tar.gz"]
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
