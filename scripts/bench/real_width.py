"""`make real-width`: the whole pipeline on the real-width synthetic checkpoint, then the benchmark.

The run gets its own workspace, a git worktree of HEAD at artifacts/real-width/ with its own DVC
cache, so the default (tiny) workspace is untouched. Its params.yaml is the committed one with the
OVERRIDES below (a params override, the same dvc.yaml); the graphs it writes record that override
in their metadata. Then `dvc repro --keep-going` there, then scripts/bench/report.py ->
results/bench.json, written even when a stage failed (it lists the stages that did not finish), and
then the failure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from scripts.pipeline import layout, params
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.pipeline.mappings import ForeignJson

# The shortest and longest default L and pair: the benchmark interpolates the ones between
# (scripts/bench/report.py default_pipeline).
OVERRIDES = {
    "model": {"source": "synthetic"},
    "lengths": [64, 256],
    "pairs": [{"prefix": 64, "suffix": 64}, {"prefix": 256, "suffix": 64}],
}
# Disk the run writes, in units of the fp32 stack: the bf16 snapshot 0.5; per graph, the graph 1; the
# bundle (every graph's weights once) 1, its copy in the release 1 (where hard links fail) and the
# tarball ~0.6 (bf16-widened noise keeps about half its bytes); a scratch graph of export_stock /
# export_bench 1, the raw file beside a graph while its metadata is embedded 1, and a graph's sections
# while verify_gpu runs 1. DVC's cache hardlinks (.dvc/config), so it adds nothing.
DISK_FIXED, DISK_PER_GRAPH = 6.1, 1.0
DISK_MARGIN = 2 * 2**30


def git(*args: str, cwd: Path = Path(".")) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def prepare(ws: Path) -> None:
    """The worktree at HEAD (created, or moved to HEAD with the committed params restored), then the overrides."""
    head = git("rev-parse", "HEAD")
    if (ws / ".git").exists():
        git("checkout", "--detach", "--force", head, cwd=ws)
    else:
        git("worktree", "add", "--detach", "--force", str(ws), head)
    path = ws / "params.yaml"
    path.write_text(yaml.safe_dump(overridden(params.read(path)), sort_keys=False))


def overridden(p: ForeignJson) -> ForeignJson:
    """params `p` with OVERRIDES applied (a mapping merges into its section, anything else replaces)."""
    p = dict(p)
    for key, value in OVERRIDES.items():
        p[key] = {**p[key], **value} if isinstance(value, dict) else value
    return p


def check_room(ws: Path, layers: int) -> None:
    from scripts.checkpoint import synthetic_checkpoint

    graphs = len(OVERRIDES["lengths"]) + len(OVERRIDES["pairs"])
    need = int((DISK_FIXED + graphs * DISK_PER_GRAPH) * synthetic_checkpoint.fp32_text_bytes(layers)) + DISK_MARGIN
    probe = ws if ws.exists() else ws.parent
    probe.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(probe).free
    if free < need:
        raise ClefError(
            f"the real-width run needs about {need / 1e9:.1f} GB free ({layers} layers), "
            f"{probe} has {free / 1e9:.1f} GB"
        )


def main() -> None:
    ws = layout.REAL_WIDTH
    layers = params.read()["model"]["synthetic_layers"]
    check_room(ws, layers)
    prepare(ws)
    print(f"real-width: workspace {ws} at {git('rev-parse', '--short', 'HEAD')}, overrides {OVERRIDES}", flush=True)
    # this run's records only: a stage that fails or is skipped leaves none (the report lists it)
    shutil.rmtree(ws / layout.RUNTIME, ignore_errors=True)
    # --keep-going: a failed stage skips only what depends on it, so the others are still measured
    failed = subprocess.run(["dvc", "repro", "--keep-going"], cwd=ws).returncode
    # each weights precision side by side on the L=64 row graph (no GPU: a software GPU runs a whole
    # real-width graph in hours; no every-graph comparison: a conversion per graph)
    bench = [sys.executable, "-m", "scripts.bench.weights_bench", "--workspace", str(ws), "--skip-reference-records"]
    if not failed and subprocess.run(bench).returncode:
        raise ClefError("the weights benchmark failed (scripts/bench/weights_bench.py)")
    if subprocess.run([sys.executable, "-m", "scripts.bench.report", "--real-width", str(ws)]).returncode:
        raise ClefError("the benchmark failed (scripts/bench/report.py)")
    if failed:
        raise ClefError(
            f"dvc repro failed in {ws} (its stage output above names the problem); results/bench.json lists "
            "the stages that did not finish"
        )


if __name__ == "__main__":
    run_stage(main, budget=False)
