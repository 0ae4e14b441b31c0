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
            "unknown key release.compression; known keys: host_weights, host_weights_precision, signing_key, "
            "max_over_recorded",
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
        (lambda p: p.update(pairs=[]), "`pairs` must be a non-empty list"),  # as lengths (issue 37)
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
        (lambda p: p["decision"]["min_same_top"].update(cpu=99.9), "decision.min_same_top.cpu 99.9 is not a fraction"),
        (lambda p: p["decision"]["min_same_top"].update(gpu_mixed=0), "min_same_top.gpu_mixed 0 is not a fraction"),
        (lambda p: p["decision"]["max_kld_mean"].update(gpu_fp32="1e-6"), "max_kld_mean.gpu_fp32 '1e-6' is not a"),
        (lambda p: p["decision"]["max_kld_mean"].pop("cpu"), "decision.max_kld_mean.cpu is missing"),
        (lambda p: p["decision"].update(enforced=["gpu"]), "decision.enforced entry 'gpu' is not one of"),
        (lambda p: p["decision"].update(scored_tokens=0), "decision.scored_tokens 0 is not an integer >= 1"),
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


@pytest.mark.parametrize("text", ["lengths: [64, 0200, 256]", "lengths: [64, 2:08]", "x: 1e-4", "x: 0o10", "x: yes"])
def test_params_yaml_is_read_as_dvc_reads_it(text):
    """YAML 1.1 (PyYAML) and 1.2 (DVC's ruamel) read these differently: `0200` was 128 to the schema and
    200 to the stages DVC ran. The schema now reads what DVC reads; PyYAML's reading is shown to differ,
    so reading with it again fails here."""
    from dvc.utils.serialize import parse_yaml

    assert params.parse_yaml(text) == parse_yaml(text, "params.yaml")
    assert yaml.safe_load(text) != parse_yaml(text, "params.yaml")


def test_check_params_reruns_on_any_edit_of_the_text():
    """DVC compares params by value (an integer written 32.0 equals 32 and the check was skipped):
    check_params depends on params.yaml's text as well, and the schema refuses the float."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["check_params"]
    assert "params.yaml" in stage["deps"]
    p = copy.deepcopy(COMMITTED)
    p["kernel_bench"]["heads"] = float(p["kernel_bench"]["heads"])
    assert "kernel_bench.heads 32.0 is not an integer >= 1" in refusal(p)


def test_lengths_and_pairs_are_held_to_the_records_the_checks_build():
    """verify_model's causality record holds L//2 + 3 tokens and a pair's chaining runs from P//2: a shorter
    length or prefix passed the schema and was refused by a stage after it removed its outputs. The
    smallest accepted sizes are ones every record fits (tests/test_row_graph.py runs verify_model's
    checks at that L)."""
    from scripts.checks import records

    least = next(n for n in range(1, 64) if records.row_unfit(n) is None)
    assert least == 5 and all(records.row_unfit(n) is None for n in range(least, 300))
    for bad, fragment in (
        ({"lengths": [64, least - 1]}, f"length {least - 1} is too short for the checks"),
        ({"pairs": [{"prefix": 1, "suffix": 64}]}, "{'prefix': 1, 'suffix': 64} is too short for the checks"),
    ):
        p = copy.deepcopy(COMMITTED)
        p.update(bad)
        assert fragment in refusal(p) and f"(L >= {least})" in refusal({**COMMITTED, "lengths": [least - 1]})
    p = copy.deepcopy(COMMITTED)
    p.update(lengths=[least], pairs=[{"prefix": 2, "suffix": 1}])
    assert refusal(p) == ""


@pytest.mark.parametrize(
    "text, fragment",
    [("", "params.yaml must hold a mapping of sections"), ('lengths: "64, 256"\n', "lengths must be a non-empty list")],
)
def test_what_dvc_refuses_by_key_the_check_names_by_file(tmp_path, text, fragment):
    """An empty params.yaml and a `lengths` that is not a list: DVC's own line names the key in dvc.yaml
    (tests/test_dvc_pipeline.py DVC_REFUSES); the check, run by hand, names params.yaml."""
    path = tmp_path / "params.yaml"
    if text.startswith("lengths"):
        text = (ROOT / "params.yaml").read_text().replace("lengths: [64, 128, 256]", text.strip())
    path.write_text(text)
    with pytest.raises(ClefError, match=fragment) as exc:
        params.load(path=path)
    assert str(exc.value).startswith(str(path)) or "params.yaml" in str(exc.value)


def test_the_row_records_real_tokens_by_kind():
    """scripts/checks/records.py: a row graph's records, all L tokens, two thirds, one; their kinds in order."""
    from scripts.checks import records

    assert records.row_tokens(64).items() == [("full", 64), ("padded", 43), ("one_token", 1)]
    assert records.ROW_KINDS == ("full", "padded", "one_token")
