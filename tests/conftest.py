"""Shared fixtures: the tiny checkpoint written once per session, a way to run a stage as DVC does, and
the whole pipeline run once per session in a temporary copy of the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import scripts  # noqa: F401  (quiets third-party import noise before torch/transformers load)
from scripts.checkpoint import fetch, snapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> tuple[Path, snapshot.SnapshotRecord]:
    """A read-only-by-convention hf/ cache holding the tiny checkpoint, and its file record."""
    cache = tmp_path_factory.mktemp("tiny") / "hf"
    repo, revision = fetch.write_tiny(cache)
    rec = snapshot.record(snapshot.snapshot_dir(cache, repo, revision), "tiny", repo, revision, root=cache.parent)
    return cache, rec


@pytest.fixture(scope="session")
def tiny_snapshot(tiny_cache) -> Path:
    cache, rec = tiny_cache
    return cache.parent / rec.path


@pytest.fixture
def workdir(tmp_path, tiny_cache) -> Path:
    """A stage working directory with its own copy of the tiny snapshot, record and params."""
    cache, rec = tiny_cache
    shutil.copytree(cache, tmp_path / "hf")
    (tmp_path / "results").mkdir()
    from scripts.pipeline import atomic

    atomic.write_json(tmp_path / "results" / "snapshot.json", rec.to_json())
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def run_stage(name: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m stages.<name>` in `cwd`, the way dvc.yaml runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", f"stages.{name}"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


# What LiteRT's runtime itself prints to stderr when an interpreter is created: not ours to shorten.
RUNTIME_LOG = ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """The stage failed with exit 2 and exactly one stderr line of ours, `error: ...`, holding every
    fragment (a refusal after a graph was loaded also carries the runtime's RUNTIME_LOG lines)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip() and line not in RUNTIME_LOG]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes: what a refusal must leave as it was."""
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def repo_copy(dest: Path) -> Path:
    """The repo's tracked and unignored files in `dest`, as a fresh git repository."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, files):
        generated = name.split("/")[0] in ("hf", "artifacts", "results") and not name.endswith(".gitignore")
        if (ROOT / name).is_file() and not generated:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "copy")
    return dest


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def tool_env() -> dict:
    """The environment of a command the way a user runs it: the venv's tools first, no test paths."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return env


def dvc_run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, env=tool_env(), capture_output=True, text=True, timeout=3600
    )


def dvc(cwd: Path, *args: str) -> str:
    proc = dvc_run(cwd, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def clef(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The `clef` console script, as installed by `make env`."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "clef"), *args],
        cwd=cwd,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=1200,
    )


WITHOUT_TORCH = ("torch", "transformers", "litert_torch")  # what a device team's venv need not hold


def clef_without_torch(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`clef ARGS` with torch, transformers and litert-torch made unimportable: a device team's venv."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {WITHOUT_TORCH!r}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from scripts.clef.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=tool_env(), capture_output=True, text=True, timeout=1200
    )


@pytest.fixture(scope="session")
def release_keys(tmp_path_factory) -> tuple[Path, Path]:
    """A throwaway signing key pair (private, public), outside every repository, as `make keys` makes it."""
    from scripts.release import signing

    return signing.make_keys(tmp_path_factory.mktemp("keys"))


# The session's pipeline runs the default params on the shortest and longest length and the shortest
# pair (TEST_PARAMS): every kind of graph and stage the defaults have, two rows and a pair in the bundle,
# and 10 of `make test`'s minutes not spent converting and checking the middle length and the two longer
# pairs (`make release` runs the defaults whole; the README's figures come from it).
TEST_PARAMS = {
    "\nlengths: [64, 128, 256]\n": "\nlengths: [64, 256]\n",  # the top-level key, not kernel_bench's
    "  - {prefix: 256, suffix: 64}\n": "",
    "  - {prefix: 128, suffix: 64}\n": "",
    "signing_key: null": "signing_key: {key}",
    # the decision figures' mechanism, on fewer windows (the software GPU runs each one in every mode)
    "\n  scored_tokens: 8192\n": "\n  scored_tokens: 1024\n",
    "\n  pair_scored_tokens: 2048\n": "\n  pair_scored_tokens: 512\n",
}


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, release_keys) -> dict:
    """`dvc repro` of the whole pipeline on the embedded default with TEST_PARAMS, once per session, in a
    temporary git copy of the repo whose params.yaml signs the release with `release_keys`. Nothing is
    committed after it: the graphs record the commit they were built at, so a forced rebuild at the same
    commit must give the same bytes. -> {"repo", "log" (stdout), "stderr", "public_key"}"""
    repo = repo_copy(tmp_path_factory.mktemp("pipeline") / "repo")
    p = yaml.safe_load((repo / "params.yaml").read_text())
    assert p["release"]["signing_key"] is None, (
        "the committed params.yaml must build unsigned (no key on a fresh clone)"
    )
    text = (repo / "params.yaml").read_text()
    for old, new in TEST_PARAMS.items():
        assert text.count(old) == 1, f"params.yaml no longer has {old!r} once: update TEST_PARAMS"
        text = text.replace(old, new.format(key=release_keys[0]))
    (repo / "params.yaml").write_text(text)
    git(repo, "commit", "-qam", "the test's lengths and pair; sign the release with a throwaway key")
    proc = dvc_run(repo, "repro")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"repo": repo, "log": proc.stdout, "stderr": proc.stderr, "public_key": release_keys[1]}


# ---- the release the session's pipeline built (tests/test_release.py, tests/test_clef.py) ----------


@pytest.fixture
def built(pipeline) -> Path:
    return pipeline["repo"] / "artifacts" / "release"


ROW = "row_L64"  # the graph the tampering tests use


def graph_file(root: Path, name: str = ROW) -> str:
    """The release path of the file that holds graph `name` (the bundle, by default)."""
    from scripts.release import reader

    return reader.load_manifest(root).artifacts[name].file


@pytest.fixture
def release_copy(built, tmp_path) -> Path:
    """A writable copy to tamper with (DVC leaves the release's files read-only)."""
    shutil.copytree(built, tmp_path / "release")
    for f in (tmp_path / "release").rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)
    return tmp_path / "release"


def pytest_collection_modifyitems(items):
    """`pipeline` on every test that needs the session's dvc repro, however indirectly: `make test-fast`
    leaves them out."""
    for item in items:
        if "pipeline" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pipeline)
