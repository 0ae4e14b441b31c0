"""Where the pipeline puts things: one place for every artifact and result path.

Rows and pairs sit in their own directories so that a stage can depend on all of them (the release
does) without depending on the release itself; the compact per-check figures that `dvc metrics show`
tabulates sit in results/metrics/, the detailed records beside them in results/.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scripts.checkpoint.snapshot import SnapshotRecord

ROWS = Path("artifacts/rows")
PAIRS = Path("artifacts/pairs")
BUNDLE = Path("artifacts/bundle")  # one .tflite with every row and pair signature over one copy of the weights
RELEASE = Path("artifacts/release")
DIST = Path("artifacts/dist")
RESULTS = Path("results")
METRICS = RESULTS / "metrics"
PLOTS = RESULTS / "plots"
GPU = RESULTS / "gpu"  # verify_gpu's detailed records, a directory of their own so the release can depend on it
REFERENCES = RESULTS / "references"  # each graph's reference record, from its verify stage, for the release
RUNTIME = RESULTS / "runtime"  # each stage's time and peak memory (scripts/pipeline/measure.py); not DVC outputs
BENCH = RESULTS / "bench.json"
REAL_WIDTH = Path("artifacts/real-width")  # the real-width run's own workspace (make real-width)
# What the two check stages leave when params.yaml passes: constant text, so valid edits change nothing
# downstream; every stage depends on the first, every stage that reads lengths or pairs on the second.
PARAMS_CHECKED = RESULTS / "checked" / "params.txt"
LENGTHS_CHECKED = RESULTS / "checked" / "lengths.txt"


def row_name(length: int) -> str:
    return f"row_L{length}"


def pair_name(prefix: int, suffix: int) -> str:
    return f"pair_P{prefix}_S{suffix}"


def row_path(length: int) -> Path:
    return ROWS / f"{row_name(length)}.tflite"


def pair_path(prefix: int, suffix: int) -> Path:
    return PAIRS / f"{pair_name(prefix, suffix)}.tflite"


def release_name(rec: SnapshotRecord, form: str, weights: str) -> str:
    """<model>-<revision[:12]>-<form>-<weights>: what the release's tarball and its bundle are called."""
    return f"{rec.repo.split('/')[-1]}-{rec.revision[:12]}-{form}-{weights}"


def bundle_path(rec: SnapshotRecord, form: str, weights: str) -> Path:
    return BUNDLE / f"{release_name(rec, form, weights)}.tflite"


def bundle_signatures(kind: str, shape: dict) -> dict[str, str]:
    """What a graph's signatures are called in the bundle: {name in its own file: name in the bundle}.
    A row's one signature takes the row's name; a pair's two keep theirs, with the pair's shape."""
    if kind == "row":
        return {"serving_default": row_name(shape["L"])}
    suffix = pair_name(shape["P"], shape["S"]).removeprefix("pair_")
    return {side: f"{side}_{suffix}" for side in ("prefix", "suffix")}


def result_path(name: str) -> Path:
    """The detailed record of one check, e.g. result_path("tflite_L64")."""
    return RESULTS / f"{name}.json"


def metrics_path(name: str) -> Path:
    """The compact figures of one check, one row of `dvc metrics show`."""
    return METRICS / f"{name}.json"


def runtime_path(stage: str, root: str | Path = ".") -> Path:
    return Path(root) / RUNTIME / f"{stage}.json"


def reference_path(graph: Path) -> Path:
    """The reference record a verify stage writes for a graph, e.g. results/references/row_L64.safetensors."""
    return REFERENCES / f"{Path(graph).stem}.safetensors"


def reference_figures_path(graph: Path) -> Path:
    """What the verify stage measured running that record through the graph (the figures the release
    states), e.g. results/references/row_L64.json."""
    return REFERENCES / f"{Path(graph).stem}.json"


def gpu_name(length: int | None = None, prefix: int | None = None, suffix: int | None = None) -> str:
    """The GPU check of a row graph (length) or a pair (prefix, suffix): its metrics row's name."""
    return f"gpu_{row_name(length) if length is not None else pair_name(prefix, suffix)}"


def gpu_result_path(name: str) -> Path:
    """verify_gpu's detailed record, e.g. gpu_result_path(gpu_name(64)) = results/gpu/gpu_row_L64.json."""
    return GPU / f"{name}.json"


DVC_YAML = Path(__file__).resolve().parents[2] / "dvc.yaml"  # the pipeline this code belongs to


def producer_of(path, dvc_yaml: str | Path = DVC_YAML) -> str:
    """The dvc.yaml stage whose outputs include `path` (a foreach stage's templates match any item)."""
    import re

    import yaml

    stages = yaml.safe_load(Path(dvc_yaml).read_text())["stages"]
    for name, raw in stages.items():
        for out in raw.get("do", raw).get("outs", []):
            template = next(iter(out)) if isinstance(out, dict) else out
            if re.fullmatch(re.sub(r"\\\$\\\{[^}]*\\\}", ".+", re.escape(template)), str(path)):
                return name
    return "the stage that writes it"


def require(path, producer: str | None = None) -> Path:
    """The path of an artifact a stage reads, or one line naming the stage that makes it (by default
    the stage dvc.yaml lists it under)."""
    from scripts.pipeline.errors import ClefError

    path = Path(path)
    if not path.is_file():
        raise ClefError(f"no {path}: run the {producer or producer_of(path)} stage first")
    return path


def read_record(path, producer: str | None = None) -> dict:
    """A JSON record another stage wrote (results/...), or one line naming that stage."""
    import json

    return json.loads(require(path, producer).read_text())
