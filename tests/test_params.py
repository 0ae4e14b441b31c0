"""scripts/pipeline/params.py: the one schema of params.yaml. The committed file passes; each bad edit the
pipeline test feeds to `dvc repro` (tests/test_dvc_pipeline.py BAD_PARAMS) is refused here too, in one
line, without DVC; and the rules that need the snapshot (check_context) see the model's context."""

from __future__ import annotations

import copy

import pytest
import yaml

from scripts.pipeline import params
from scripts.pipeline.errors import ClefError
from tests.conftest import ROOT
from tests.test_dvc_pipeline import BAD_PARAMS

COMMITTED = yaml.safe_load((ROOT / "params.yaml").read_text())
TINY_CONTEXT = 4096  # the tiny checkpoint's max_position_embeddings


def refusal(p: dict) -> str:
    """The one line the checks give for params `p` (the schema, then the context), or ''."""
    try:
        params.check_all(p)
        params.check_context(p, TINY_CONTEXT)
    except ClefError as exc:
        return str(exc)
    return ""


def test_committed_params_pass():
    assert refusal(copy.deepcopy(COMMITTED)) == ""
    assert params.load(path=ROOT / "params.yaml") == COMMITTED


@pytest.mark.parametrize("case", sorted(BAD_PARAMS))
def test_each_bad_edit_refused_in_one_line(case):
    edit, fragment = BAD_PARAMS[case]
    p = copy.deepcopy(COMMITTED)
    edit(p)
    said = refusal(p)
    assert fragment in said and "\n" not in said, said


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda p: p.pop("verify_gpu"), "missing section `verify_gpu`"),
        (lambda p: p["verify_tflite"].pop("latency_repeats"), "verify_tflite.latency_repeats is missing"),
        (
            lambda p: p["release"].update(compression="x"),
            "unknown key release.compression; known keys: host_weights, signing_key, max_over_recorded",
        ),
        (lambda p: p["release"].update(signing_key=""), "release.signing_key '' must be a file path or null"),
        (lambda p: p["release"].update(signing_key=7), "release.signing_key 7 must be a file path or null"),
        (lambda p: p["release"].update(max_over_recorded=0), "release.max_over_recorded 0 is not a positive number"),
        (lambda p: p["release"].update(max_over_recorded=0.5), "release.max_over_recorded 0.5 is below 1"),
        (lambda p: p.update(stack=[1.15]), "`stack` must be a mapping with rss_factor, rss_overhead_gib"),
        (lambda p: p["stack"].update(rss_overhead_gib=-1), "stack.rss_overhead_gib -1 is not a number >= 0"),
        (lambda p: p["verify_kernel"].update(forms=["R64", "R7"]), "verify_kernel.forms: form 'R7': chunk 7"),
        (lambda p: p["verify_kernel"].update(forms="R64"), "verify_kernel.forms must be a list of kernel forms"),
        (lambda p: p["kernel_bench"].update(heads=True), "kernel_bench.heads True is not an integer >= 1"),
        (lambda p: p["kernel_bench"].update(lengths=[64, 64]), "kernel_bench.lengths [64, 64] repeat a value"),
        (lambda p: p.update(lengths=[]), "lengths must be a non-empty list"),
        (
            lambda p: p["verify_gpu"].update(fp16_max_over_floor=float("inf")),
            "fp16_max_over_floor inf is not a positive",
        ),
        (lambda p: p["verify_gpu"].update(layers=4), "verify_gpu.layers 4 is not one of auto, block, all"),
        (lambda p: p["verify_gpu"].update(held_to_floor=["fp8"]), "verify_gpu.held_to_floor entry 'fp8' is not one"),
        (lambda p: p["verify_gpu"].update(held_to_floor="mixed"), "verify_gpu.held_to_floor 'mixed' is not a list"),
        (
            lambda p: p["model"].update(source="synthetic", synthetic_layers=0),
            "model.synthetic_layers 0 is not an integer >= 1",
        ),
        (lambda p: p["model"].update(revision="F0B7D3CD65296ABFE459E6C228B618F5D8B26D2F"), "40-hex"),
        (lambda p: p["pairs"].append({"prefix": 64, "suffix": 64}), "is listed twice"),
    ],
)
def test_schema_rules(edit, fragment):
    p = copy.deepcopy(COMMITTED)
    edit(p)
    assert fragment in refusal(p)


def test_synthetic_needs_its_layer_count():
    p = copy.deepcopy(COMMITTED)
    p["model"] = {k: v for k, v in p["model"].items() if k != "synthetic_layers"}
    assert refusal(p) == ""  # tiny and hub do not read it
    p["model"]["source"] = "synthetic"
    assert "model.synthetic_layers is missing" in refusal(p)


def test_context_is_the_snapshot_s():
    """A pair fits when prefix + suffix does, a length when it is at most the context itself."""
    p = copy.deepcopy(COMMITTED)
    p["lengths"], p["pairs"] = [64, 4096], [{"prefix": 4032, "suffix": 64}]
    params.check_context(p, 4096)
    with pytest.raises(ClefError, match="length 4096 is above the model's max_position_embeddings \\(4095\\)"):
        params.check_context(p, 4095)


def test_load_checks_only_the_sections_a_stage_reads(tmp_path):
    """A stage run by hand checks what it reads; the whole file is check_params's job."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"model": COMMITTED["model"], "lenghts": [64]}))
    assert params.load(["model"], path)["model"] == COMMITTED["model"]
    with pytest.raises(ClefError, match="unknown section lenghts; did you mean lengths"):
        params.load(path=path)
    path.write_text("lengths: [64\n")
    with pytest.raises(ClefError, match="is not valid YAML"):
        params.load(["lengths"], path)
