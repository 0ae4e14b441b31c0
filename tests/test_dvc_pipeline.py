"""dvc.yaml is honest (every stage depends on all the code it runs), and the whole pipeline runs on
the embedded default in a temporary copy of the repo: twice (the second run does nothing), then once
more after a parameter change (only the stages that read it rerun)."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

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


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_declares_the_params_it_reads(name):
    stage = STAGES[name]
    entry = ROOT / Path(*stage["cmd"].split("python -m ", 1)[1].split()[0].split(".")).with_suffix(".py")
    assert params_sections_read(entry) == set(stage.get("params", []))


def test_link_cache_configured():
    """A 19 GB snapshot must not be copied into DVC's cache: links first, copy last. Hardlink leads
    because DVC commits a stage's new output by hardlink only when hardlink is the first type."""
    config = (ROOT / ".dvc" / "config").read_text()
    assert 'type = "hardlink,reflink,symlink,copy"' in config


def repo_copy(dest: Path) -> Path:
    """The repo's tracked and unignored files in `dest`, as a fresh git repository."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        generated = name.split("/")[0] in ("hf", "artifacts", "results") and not name.endswith(".gitignore")
        if (ROOT / name).is_file() and not generated:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


def dvc(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_pipeline_end_to_end(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    first = dvc(repo, "repro")
    for name in STAGES:
        assert f"Running stage '{name}" in first, first  # foreach stages run as name@item
    assert (repo / "results" / "stack.json").is_file()
    cached = {p.stat().st_ino for p in (repo / ".dvc" / "cache").rglob("*") if p.is_file()}
    shards = list((repo / "hf").rglob("*.safetensors"))
    assert shards and all(p.stat().st_ino in cached for p in shards), "hf/ is a second copy of DVC's cache"

    lengths = yaml.safe_load((repo / "params.yaml").read_text())["lengths"]
    for n in lengths:
        doc = json.loads((repo / "results" / f"tflite_L{n}.json").read_text())
        assert doc["passed"] and doc["metadata"]["L"] == n and (repo / "artifacts" / f"row_L{n}.tflite").is_file()

    for pair in yaml.safe_load((repo / "params.yaml").read_text())["pairs"]:
        doc = json.loads((repo / "results" / f"pair_P{pair['prefix']}_S{pair['suffix']}.json").read_text())
        assert doc["summary"]["passed"] and set(doc["census"]["signatures"]) == {"prefix", "suffix"}
    # a pair stores its weights once: about the size of one row graph, not two
    small = min(yaml.safe_load((repo / "params.yaml").read_text())["pairs"], key=lambda q: q["prefix"])
    pair_bytes = (repo / "artifacts" / f"pair_P{small['prefix']}_S{small['suffix']}.tflite").stat().st_size
    row_bytes = (repo / "artifacts" / f"row_L{min(lengths)}.tflite").stat().st_size
    assert pair_bytes < 1.25 * row_bytes, (pair_bytes, row_bytes)

    second = dvc(repo, "repro")
    assert "Data and pipelines are up to date." in second and "Running stage" not in second, second

    # a rebuild from the same inputs is byte-identical
    row = repo / "artifacts" / f"row_L{lengths[0]}.tflite"
    before = hashlib.sha256(row.read_bytes()).hexdigest()
    dvc(repo, "repro", "--force", "--single-item", f"export@{lengths[0]}")
    assert hashlib.sha256(row.read_bytes()).hexdigest() == before

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["form"] = "R32+sp+ec+dd+vs6"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    changed = json.loads(dvc(repo, "status", "--json"))
    raw = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]

    def instances(name):  # foreach over a list of values -> name@value; of mappings -> name@index
        if "foreach" not in raw[name]:
            return [name]
        items = params[raw[name]["foreach"].strip("${}")]
        return [f"{name}@{i if isinstance(item, dict) else item}" for i, item in enumerate(items)]

    form_stages = sorted(i for n, st in STAGES.items() if "form" in st.get("params", []) for i in instances(n))
    assert len(form_stages) >= 2 and sorted(changed) == form_stages, changed  # the form's stages, nothing upstream

    params["form"] = "R64+sp+ec+dd+vs6"
    params["model"]["revision"] = "0" * 40  # read only by fetch; the tiny snapshot it writes is the same
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    third = dvc(repo, "repro")
    assert "Running stage 'fetch'" in third and "Running stage 'stack'" not in third, third
    assert "Running stage 'verify_kernel'" not in third, third
