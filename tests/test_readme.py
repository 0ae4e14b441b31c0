"""scripts/pipeline/readme.py: the README's figure tables come from the pipeline's records and name
the run; a block without records, or of an unknown table, is one line, not a stale table."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from scripts.pipeline import atomic, layout, readme
from scripts.pipeline.errors import ClefError
from scripts.pipeline.provenance import GitState
from scripts.release import reader
from tests.conftest import ROOT
from tests.test_release import small_release

ROWS = {
    "kernel": {
        "passed": True,
        "max_rel": 9.3e-7,
        "max_rel_per_position": 1.4e-5,
        "threshold": 1e-5,
        "threshold_per_position": 1e-4,
        "control_over_threshold": 107148.0,
    },
    "tflite_L64": {
        "L": 64,
        "passed": True,
        "max_rel": 3.0e-6,
        "max_rel_per_position": 7.0e-6,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "bytes": 7626840,
        "op_total": 1456,
        "ops_per_gdn_layer": 169,
        "max_rank": 4,
        "litert_ms": 5.9,
        "torch_over_litert": 3.5,
    },
    "pair_P64_S64": {
        "P": 64,
        "S": 64,
        "passed": False,
        "max_rel": 2e-4,
        "max_rel_per_position": 3e-4,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "bytes": 8647744,
        "max_rel_state": 4.7e-6,
        "op_total": 3087,
        "control_over_threshold": 14249.0,
    },
    "gpu_row_L64": {
        "L": 64,
        "passed": True,
        "fully_accelerated": True,
        "max_rel": 3.9e-6,
        "max_rel_per_position": 9.7e-6,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "fp16_max_rel": 0.032,
        "fp16_over_floor": 3.8,
        "mixed_over_floor": 1.3,
        "layers_checked": 4,
    },
    # written before verify_gpu ran mixed (and kept the layers it ran): still rendered, "-" there
    "gpu_pair_P64_S64": {
        "P": 64,
        "S": 64,
        "passed": True,
        "fully_accelerated": True,
        "max_rel": 4.1e-6,
        "max_rel_per_position": 8.0e-6,
        "threshold": 1e-4,
        "threshold_per_position": 1e-4,
        "fp16_max_rel": 0.012,
        "fp16_floor": 0.0029,
        "fp16_over_floor": 4.0,
    },
    "bundle": {"passed": True, "max_rel": 0.0, "threshold": 0.0, "bytes": 9847368, "op_total": 13551, "max_rank": 4},
    "export_bench": {
        "L": 64,
        "ops_per_gdn_layer": 169,
        "gdn_ops_stock_over_form": 5.5,
        "convert_time_stock_over_form": 5.2,
        "litert_time_stock_over_form": 2.4,
    },
}
# verify_gpu's record of gpu_row_L64 (results/gpu/): the floor, each mode's figures, the stack's layers
GPU_RECORDS = {
    "gpu_row_L64": {
        "layers": 8,
        "modes": {
            "fp16": {"floor_max_rel_vs_f64": 0.0083, "over_floor": 3.8},
            "mixed": {"max_rel_vs_f64": 0.011, "over_floor": 1.3, "over_floor_per_position": 1.6},
        },
    }
}
# the bundle stage's record (results/bundle.json), as much of it as the table reads
BUNDLE_RECORD = {
    "sharing": {"bytes": 9847368, "constant_bytes": 7286488, "part_constant_bytes": 45511452},
    "largest_graph": {"file": "artifacts/pairs/pair_P256_S64.tflite", "bytes": 9255644},
    "bytes_over_graph": 1.064,
    "bytes_goal_over_graph": 1.1,
    "duplicate_constants": {"buffers": 0, "bytes": 0},
    "signatures": {"row_L64": 0, "prefix_P64_S64": 1, "suffix_P64_S64": 2},
    "identity": [
        {"graph": "row_L64", "accelerator": "cpu", "identical": True},
        {"graph": "pair_P64_S64", "accelerator": "cpu", "identical": False},
    ],
    "gpu_checked": False,
    "gpu_not_checked_why": "verify_gpu.layers resolves to block",
    "memory": {
        "cpu": {
            "bundle": {"held": 2**26, "peak": 2**26},
            "largest_graph": {"held": 2**25, "peak": 2**25},
            "held_over_graph": 2.0,
            "peak_over_graph": 2.0,
        }
    },
    "memory_goal_over_graph": 1.2,
}
README = "intro\n" + "".join(f"<!-- generated: {n} -->\nold\n<!-- end generated: {n} -->\n" for n in readme.TABLES)


@pytest.fixture
def workspace(tmp_path):
    for name, row in ROWS.items():
        atomic.write_json(tmp_path / layout.metrics_path(name), row)
    for name, record in GPU_RECORDS.items():
        atomic.write_json(tmp_path / layout.gpu_result_path(name), record)
    atomic.write_json(tmp_path / layout.result_path("bundle"), BUNDLE_RECORD)
    release = tmp_path / layout.RELEASE
    manifest = dataclasses.replace(small_release(release), git=GitState("abcdef0123456789", True, []))
    atomic.write_json(release / reader.MANIFEST, manifest.to_json())
    return tmp_path


def test_a_manifest_without_its_graph_entries_is_refused(workspace):
    """The release manifest is read as its record: one lacking `artifacts` is one line naming it."""
    path = workspace / layout.RELEASE / reader.MANIFEST
    doc = json.loads(path.read_text())
    del doc["artifacts"]
    atomic.write_json(path, doc)
    with pytest.raises(ClefError, match=r"manifest.json has no `artifacts`"):
        readme.render(README, workspace)


def test_tables_carry_the_records_and_name_the_run(workspace):
    text, changed = readme.render(README, workspace)
    assert changed == list(readme.TABLES) and "old" not in text and text.startswith("intro\n")
    assert text.count("From the `dvc repro` at commit abcdef0 (clean)") == len(readme.TABLES)
    assert "| row L=64: LiteRT vs torch | yes | 3.0e-06 | 7.0e-06 | 0.0001, 0.0001 | n/a |" in text
    assert "| pair P=64 S=64: chaining vs row | **no** | 2.0e-04 | 3.0e-04 |" in text  # a failed check shows
    assert "| 64 | 7,626,840 | 1456 | 169 | 4 | 5.9 ms | 3.5x |" in text
    # the bundle: its size against the largest graph, identity per accelerator (a differing graph shows),
    # the GPU check that did not run and why, memory against the goal
    assert (
        "| bundle | 9,847,368 bytes: 1.064x the largest graph (`pair_P256_S64.tflite`, 9,255,644; goal 1.1x) |" in text
        and "the graphs held 45,511,452 (6.2x); read back from the file, 0 stored twice |" in text
    )
    assert "| identical to its own file, CPU | 1 of 2 graphs |" in text
    assert "| GPU | not run: verify_gpu.layers resolves to block |" in text
    assert "| 64.0 MiB vs 32.0 MiB for the largest graph (2.00x; peak 2.00x; goal 1.2x) |" in text
    assert readme.render(text, workspace) == (text, [])  # rendering again changes nothing


def test_gpu_table_has_each_mode_and_its_ratio_to_the_floor(workspace):
    """fp32 vs torch, the floor, fp16 and mixed vs float64 and their ratios to the floor, global (per
    position); a metrics row from before mixed existed renders with "-" in its columns."""
    gpu = readme.gpu_table(readme.read_metrics(workspace))
    header, _, *body = gpu.splitlines()
    assert header == (
        "| graph | layers run | fully accelerated | fp32 vs torch (worst position) | floor: torch float16 "
        "| fp16 vs float64 | fp16 / floor | mixed vs float64 | mixed / floor (per position) |"
    )
    assert body == [
        "| row L=64 | 4 of 8 | yes | 3.9e-06 (9.7e-06) | 8.3e-03 | 3.2e-02 | 3.8 | 1.1e-02 | 1.3 (1.6) |",
        "| pair P=64 S=64 | - | yes | 4.1e-06 (8.0e-06) | 2.9e-03 | 1.2e-02 | 4.0 | - | - |",
    ]
    # fp16's ratio per position, where a row has it, is shown and named like mixed's
    modes = GPU_RECORDS["gpu_row_L64"]["modes"]
    row = {
        **ROWS["gpu_row_L64"],
        **GPU_RECORDS["gpu_row_L64"],
        "modes": {
            "fp16": {**modes["fp16"], "over_floor_per_position": 4.4},
            "mixed": {**modes["mixed"], "over_floor": float("nan")},
        },
    }
    gpu = readme.gpu_table({"gpu_row_L64": row})
    assert "| fp16 / floor (per position) |" in gpu and "| 3.8 (4.4) | 1.1e-02 | nan (1.6) |" in gpu


def test_a_changed_record_changes_the_table(workspace):
    text, _ = readme.render(README, workspace)
    atomic.write_json(workspace / layout.metrics_path("tflite_L64"), {**ROWS["tflite_L64"], "max_rel": 4.0e-6})
    again, changed = readme.render(text, workspace)
    assert "checks" in changed and "| 4.0e-06 |" in again


def test_no_records_or_unknown_block_is_one_line(tmp_path, workspace):
    with pytest.raises(ClefError, match="no metrics under .*run `dvc repro` first"):
        readme.render(README, tmp_path / "empty")
    with pytest.raises(ClefError, match="block `throughput` has no table"):
        readme.render("<!-- generated: throughput -->\n<!-- end generated: throughput -->\n", workspace)


def test_every_table_is_generated_once_across_the_readme_and_docs():
    found = [m.group("name") for doc in readme.documents(ROOT) for m in readme.BLOCK.finditer((ROOT / doc).read_text())]
    assert sorted(found) == sorted(readme.block_names()), found


def test_the_readme_is_short_and_every_link_stays_in_the_repository():
    """A newcomer reads the README in minutes and follows its links to docs/; every relative link in the
    documents resolves to a file of the repository (none to the designers' notes outside it)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    docs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / readme.DOCS).glob("*.md"))
    assert docs and all(f"]({d})" in text for d in docs), docs
    for doc in readme.documents(ROOT):
        body = (ROOT / doc).read_text()
        assert "DESIGN.md" not in body and "../shared" not in body, doc
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", body):
            assert (ROOT / doc).parent.joinpath(target).resolve().is_relative_to(ROOT), (doc, target)
            assert (ROOT / doc).parent.joinpath(target).exists(), (doc, target)


def test_the_pipeline_diagram_is_drawn_from_dvc_yaml(tmp_path):
    """An arrow where a stage reads what another writes, none where a longer path leads there; broken
    once on purpose: a stage that stops reading an output loses its arrow."""
    stages = {
        "check_params": {"cmd": "c", "outs": ["results/checked/params.txt"]},
        "fetch": {"cmd": "f", "deps": ["results/checked/params.txt"], "outs": ["hf"]},
        "export": {"foreach": [64], "do": {"cmd": "e", "deps": ["hf"], "outs": ["artifacts/rows/row_L${item}.tflite"]}},
        "verify": {"cmd": "v", "deps": ["hf", "artifacts/rows/row_L64.tflite"], "outs": ["results/v.json"]},
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    drawn = readme.dag_diagram(tmp_path)
    assert "fetch[fetch] --> export[export@each]" in drawn and "export[export@each] --> verify[verify]" in drawn
    assert "fetch[fetch] --> verify" not in drawn  # through export already
    assert "check_params[" not in drawn and "`check_params`" in drawn  # a gate: named, not drawn
    stages["verify"]["deps"] = ["hf"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    assert "--> verify[verify]" in readme.dag_diagram(tmp_path)
    assert "export[export@each] --> verify" not in readme.dag_diagram(tmp_path)


def test_a_picture_in_docs_links_back_to_results(workspace):
    text = "<!-- generated: picture_errors -->\n<!-- end generated: picture_errors -->\n"
    rendered, _ = readme.render(text, workspace, document=readme.DOCS / "checks.md")
    assert "](../results/figures/errors.svg)" in rendered


def test_run_outside_the_repository_is_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "scripts.pipeline.readme"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: no README.md here"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def bench(missing=(), anon=30.0) -> dict:
    stage = {"seconds": 100.0, "peak_rss_gib": 5.0, "peak_anon_gib": 4.0, "finished_utc": "t1", "budget_gib": 6.2}
    return {
        "measured_utc": "2026-11-30T00:00:00Z",
        "machine": {"cpu": "AMD EPYC", "cores": 2},
        "efficiency": {"matmul_peak": {"gflops": 118.9}},
        "tiny": {"stages": {"export@64": {"seconds": 10.0, "peak_anon_gib": 0.4}}},
        "real_width": {
            "commit": "abc1234",
            "stages": {"export@64": {**stage, "within_budget": anon < 35}},
            "stages_not_finished": list(missing),
            "graph_bytes": 4e9,
            "tarball_bytes": 2e9,
            "ops_per_gdn_layer": {"64": 146, "256": 193},
            "gpu": {  # scripts/bench/report.py gpu_figures: a record with modes, and one from before mixed
                "gpu_pair_P64_S64": {
                    "layers_checked": 4,
                    "layers": 4,
                    "fp16": {"over_floor": 9.5, "over_floor_per_position": 11.2},
                    "mixed": {"over_floor": 1.3, "over_floor_per_position": 1.7},
                },
                "gpu_row_L64": {"layers_checked": 4, "layers": 4, "fp16": {"over_floor": 12.0}},
            },
        },
        "clef_flash": {
            "blocks": 8,
            "stages": {"export@64": {"seconds": 800.0, "peak_anon_gib": anon}},
            "row_graph_bytes_per_L": 2.8e10,
            "snapshot_bytes": 1.93e10,
            "fp32_stack_bytes": 2.77e10,
            "default_pipeline": {
                "lengths": [64, 128, 256],
                "pairs": [{"prefix": 64, "suffix": 64}],
                "hours": 2.5,
                "gpu_hours": 1.2,
                "accelerator_hours": 0.9,
                "peak_anon_gib": anon,
                "peak_anon_stage": "export@64",
                "memory_budget_gib": 35.5,
                "within_budget": anon <= 35.5,
            },
        },
    }


def test_bench_tables_say_what_is_measured_and_what_did_not_finish(tmp_path):
    doc = "<!-- generated: real_width -->\n<!-- end generated: real_width -->\n"
    doc += "<!-- generated: real_run -->\n<!-- end generated: real_run -->\n"
    with pytest.raises(ClefError, match="no .*bench.json: run `make real-width`"):
        readme.render(doc, tmp_path)
    atomic.write_json(tmp_path / layout.BENCH, bench())
    text, changed = readme.render(doc, tmp_path)
    assert changed == ["real_width", "real_run"] and "From `make real-width` at commit abc1234" in text
    assert "(AMD EPYC, 2 cores, fp32 matmul peak 119 GFLOP/s)" in text  # the times are this CPU's
    assert "| `export@64` | 10 s, 0.4 GiB | 100 s, 5.0 GiB, 4.0 GiB / 6.2 | 800 s, 30.0 GiB |" in text
    assert "30.0 GiB peak anonymous memory (`export@64`), within the budget 35.5 GiB" in text
    assert "2.5 h on 2 cores" in text and "146 at L=64, 193 at L=256" in text and "did not finish" not in text
    assert "of which 1.2 h `verify_gpu` on the software GPU (lavapipe) (0.9 h of it compiling" in text
    assert "; 1.6 h without that)" in text
    # the GPU's half modes at real width, rows before pairs, "-" where a record has no mixed
    assert "On the GPU accelerator at real width, ratio to the torch-float16 floor:" in text
    assert "| graph | layers run | fp16 / floor (per position) | mixed / floor (per position) |" in text
    assert "| row L=64 | 4 of 4 | 12.0 | - |\n| pair P=64 S=64 | 4 of 4 | 9.5 (11.2) | 1.3 (1.7) |" in text
    assert "| release | not measured: the real-width run predates the bundle stage |" in text
    # with the bundle: what clef-flash's release would weigh and its stage take, against the goals
    bundled = bench()
    bundled["real_width"]["bundle"] = {"bytes": 3.6e9}
    bundled["clef_flash"].update(bundle_bytes=2.88e10, release_bytes=2.95e10)
    bundled["clef_flash"]["default_pipeline"]["stages"] = {"release": {"seconds": 240.0}}
    atomic.write_json(tmp_path / layout.BENCH, bundled)
    text, _ = readme.render(doc, tmp_path)
    assert (
        "| release | the bundle 28.8 GB, the release 29.5 GB (goal <= 30 GB); the release stage 4.0 min (goal <= 5) |"
        in text
    )
    # a bench.json made before it kept the GPU figures renders without them
    old = bench()
    del old["real_width"]["gpu"]
    atomic.write_json(tmp_path / layout.BENCH, old)
    text, _ = readme.render(doc, tmp_path)
    assert "| `export@64` |" in text and "On the GPU accelerator" not in text
    # a bench made with no tiny run here (a fresh machine: make real-width before make release) has no
    # extrapolation to show: refused in one line, not rendered as zero hours
    unextrapolated = bench()
    unextrapolated["clef_flash"].update(stages={}, without_tiny_run=["export@64"])
    atomic.write_json(tmp_path / layout.BENCH, unextrapolated)
    with pytest.raises(ClefError, match=r"no tiny run .* run make release, then make bench \(`export@64`\)"):
        readme.render(doc, tmp_path)
    atomic.write_json(tmp_path / layout.BENCH, bench(missing=["verify_gpu_row@64"], anon=36.0))
    text, _ = readme.render(doc, tmp_path)
    assert "| `verify_gpu_row@64` |  | **did not finish** (failed, or skipped after a failure) |  |" in text
    assert "**over** the budget" in text and "without `verify_gpu_row@64`" in text


def variant(bytes_, conversion, top1, litert_s, gpu):
    return {
        "bytes": bytes_,
        "conversion": {"max_rel_vs_torch": conversion, "max_rel_per_position_vs_torch": 2 * conversion},
        "vs_fp32_graph": {"max_rel": 7e-7},
        "quantization_effect": {"min_top1_agreement": top1, "min_top5_agreement": 0.8, "max_mean_kl": 0.15},
        "cpu": {"litert_median_s": litert_s, "fraction_of_peak": 0.72},
        "gpu": gpu,
    }


def test_the_weights_table_shows_each_precision_and_the_gpu_refusal(tmp_path):
    refused = {m: {"compiled": False, "refused": "DEQUANTIZE ..."} for m in ("fp32", "fp16")}
    ran = {"fp32": {"compiled": True, "fully_accelerated": True, "median_s": 0.36, "max_rel_vs_torch": 3.6e-6}}
    doc = {
        "measured_utc": "2026-12-03T21:41:29Z",
        "source": "tiny",
        "L": 64,
        "records": {"full": 64},
        "variants": {
            "fp32": variant(7_524_548, 2.6e-6, 1.0, 0.0109, ran),
            "int8": variant(2_689_280, 4.5e-6, 0.837, 0.0057, refused),
        },
        "bytes_over_fp32": {"fp32": 1.0, "int8": 0.357},
        "litert_speedup_over_fp32": {"fp32": 1.0, "int8": 1.9},
        "reference_records": {"workspace_weights": "fp32", "converted_at": "fp16", "max_rel": 2.0e-6, "rows": [{}] * 6},
    }
    block = "<!-- generated: weights -->\nold\n<!-- end generated: weights -->\n"
    with pytest.raises(ClefError, match="no .*weights.json: run `make weights-bench` first"):
        readme.render(block, tmp_path)
    atomic.write_json(tmp_path / layout.result_path("weights"), doc)
    text, changed = readme.render(block, tmp_path)
    assert changed == ["weights"]
    assert "| `int8` | 2,689,280 (0.357x) | 4.5e-06 / 9.0e-06 | 7.0e-07 | 0.837 / 0.800 / 1.5e-01 |" in text
    assert "5.7 ms (1.90x); 0.72 of peak | fp16: refused; fp32: refused |" in text
    assert "| fp32 360 ms, 3.6e-06 |" in text
    assert "fp32 file against its fp16 twin: max rel 2.0e-06 over 6 graphs" in text
    assert text.index("`fp32`") < text.index("`int8`")  # the largest first


def test_the_weights_summary_gives_each_precision_as_the_pipeline_stores_it_beside_llama_cpp(tmp_path):
    """One row per `weights`, the variant the pipeline makes (int8: read by the FULLY_CONNECTED itself): its
    exact form's conversion error, the CPU's dynamic kernels, its decisions against llama.cpp's q8_0."""
    whole = {
        m: {"compiled": True, "fully_accelerated": True, "median_s": 0.2, "max_rel_vs_torch": 8.6e-7}
        for m in ("fp32", "fp16", "mixed")
    }
    refused = {m: {"compiled": False, "refused": "DEQUANTIZE ..."} for m in ("fp32", "fp16", "mixed")}

    def made(kld, top):
        return {"kld_mean": kld, "same_top": top, "ln_ppl_ratio": 1e-3}

    dynamic = {**variant(3_397_888, 2.8e-2, 0.97, 0.0035, whole), "weights": "int8", "scheme": "dynamic"}
    dynamic.update(exact_form={"max_rel_vs_torch": 8.1e-7}, decision=made(2.0e-3, 0.9825))
    doc = {
        "measured_utc": "2026-12-07T12:06:52Z",
        "source": "tiny",
        "L": 64,
        "variants": {
            "fp16": {**variant(4_198_656, 9.1e-7, 1.0, 0.0056, whole), "weights": "fp16", "scheme": "weight_only"},
            "int8": {**variant(2_935_040, 8.1e-7, 0.98, 0.011, refused), "weights": "int8", "scheme": "weight_only"},
            "int8_dynamic": dynamic,
        },
        "bytes_over_fp32": {"fp16": 0.558, "int8": 0.390, "int8_dynamic": 0.452},
        "litert_speedup_over_fp32": {"fp16": 0.66, "int8": 1.02, "int8_dynamic": 1.6},
    }
    atomic.write_json(tmp_path / layout.result_path("weights"), doc)
    block = "<!-- generated: weights_summary -->\n<!-- end generated: weights_summary -->\n"
    text, _ = readme.render(block, tmp_path)
    row = "| `int8` | 3,397,888 (0.452x) | 8.1e-07 / 8.6e-07 | 2.8e-02 | 2.0e-03 / 98.25 % / +1.0e-03 |"
    assert row in text, text
    assert "`q8_0` 1.4e-03 / 97.67 %; better: no | 1.60x | every mode whole |" in text
    assert "| `fp16` | 4,198,656 (0.558x) | 9.1e-07 / 8.6e-07 | - | - | - |" in text
    assert "2,935,040" not in text  # int8 through a DEQUANTIZE is not what the pipeline stores
    dynamic["decision"] = made(7e-4, 0.99)
    atomic.write_json(tmp_path / layout.result_path("weights"), doc)
    assert "better: yes" in readme.render(block, tmp_path)[0]


def test_the_real_width_weights_table_gives_each_precision_and_the_release_against_its_goal(tmp_path):
    doc = "<!-- generated: real_weights -->\n<!-- end generated: real_weights -->\n"
    old = bench()
    atomic.write_json(tmp_path / layout.BENCH, old)
    text, _ = readme.render(doc, tmp_path)
    assert "Not measured: the real-width run predates the weights bench" in text
    compiled = {"fp16": {"compiled": True, "run": False, "fully_accelerated": True}}
    partly = {"fp16": {"compiled": True, "run": False, "fully_accelerated": False}}
    refused = {"fp16": {"compiled": False, "refused": "DEQUANTIZE ..."}}

    def figures(bytes_, litert_s, gpu):
        return {
            "bytes": bytes_,
            "conversion_max_rel": 2.6e-6,
            "conversion_max_rel_per_position": 5.8e-6,
            "litert_median_s": litert_s,
            "torch_median_s": 1.5,
            "fraction_of_peak": 0.5,
            "gpu": gpu,
        }

    old["tiny"]["params"] = {"weights": "fp16"}
    old["real_width"]["weights"] = {
        "L": 64,
        "bytes_over_fp32": {"fp32": 1.0, "fp16": 0.5, "int8": 0.26},
        "litert_speedup_over_fp32": {"fp32": 1.0, "fp16": 0.9, "int8": 1.6},
        "variants": {
            "fp32": figures(3.46e9, 1.2, partly),
            "fp16": figures(1.73e9, 1.33, compiled),
            "int8": figures(0.9e9, 0.75, refused),
        },
    }
    old["clef_flash"]["release_bytes_by_weights"] = {"fp32": 27.7e9, "fp16": 16.0e9, "int8": 7.4e9}
    atomic.write_json(tmp_path / layout.BENCH, old)
    text, _ = readme.render(doc, tmp_path)
    assert "| `fp16` (default) | 1.73 GB (0.500x) | 2.6e-06 / 5.8e-06 |" in text
    assert (
        "1.33 s (0.90x); 0.50 of peak; torch eager 1.50 s | fp16 compiled whole, not run | 16.0 GB (goal <= 15 GB) |"
        in text
    )
    assert "| fp16 compiled, partly, not run | 27.7 GB |" in text  # fp32: no goal of its own
    assert "| fp16: refused | 7.4 GB (goal <= 8 GB) |" in text
    assert text.index("`fp32`") < text.index("`fp16`") < text.index("`int8`")
    # with the host tables at each precision (issue 52: int4's goal counts graphs and host tables together)
    old["clef_flash"]["release_bytes_by_weights_and_host"] = {"int8": {"bf16": 7.4e9, "int8": 5.4e9, "int4b32": 4.5e9}}
    atomic.write_json(tmp_path / layout.BENCH, old)
    text, _ = readme.render(doc, tmp_path)
    assert "| fp16: refused | 7.4 GB; host tables int8 5.4 GB, int4b32 4.5 GB (goal <= 8 GB) |" in text


def test_the_release_is_extrapolated_with_its_host_tables_at_each_precision():
    """clef-flash's host tables are extrapolated at its vocabulary (the synthetic checkpoint keeps the tiny
    tokenizer's), at the release's precision and at each other one."""
    from scripts.bench import report

    host = {"file_bytes": 4_000, "shapes": {"embed_tokens": [320, 10], "lm_head": [320, 10]}}
    bf16 = 2 * report.CLEF_FLASH_VOCAB * 10 * 2
    assert report.clef_flash_host_bytes(host, "bf16") == bf16
    got = report.with_host_tables({"int4_dynamic": 10_000}, host, "bf16")["int4_dynamic"]
    assert got["bf16"] == 10_000
    assert got["int8"] == 10_000 - bf16 + 2 * (report.CLEF_FLASH_VOCAB * 10 + 4 * report.CLEF_FLASH_VOCAB)
    assert (
        report.with_host_tables(None, host, "bf16") is None and report.with_host_tables({"x": 1}, None, "bf16") is None
    )


def test_params_table_says_which_stages_each_key_reruns(tmp_path):
    """From dvc.yaml: a declared key names its stages, a foreach names its items, a bound reruns only the
    stages that read the whole file; declaring a bound in a stage shows there (and is refused elsewhere:
    tests/test_dvc_pipeline.py test_no_stage_declares_a_bound)."""
    import shutil

    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    rows = {
        r.split(" | ")[0].lstrip("| "): r for r in readme.params_table(tmp_path).splitlines() if r.startswith("| `")
    }
    assert "| only check_params and release | a bound" in rows["`memory`"]
    assert "export (one per item)" in rows["`lengths`"] and "verify_model" in rows["`lengths`"]
    assert rows["`verify_kernel.forms`"].split(" | ")[1] == "verify_kernel"
    text = (
        (tmp_path / "dvc.yaml")
        .read_text()
        .replace("      - verify_kernel.forms\n", "      - verify_kernel.forms\n      - memory\n")
    )
    (tmp_path / "dvc.yaml").write_text(text)
    rows = {
        r.split(" | ")[0].lstrip("| "): r for r in readme.params_table(tmp_path).splitlines() if r.startswith("| `")
    }
    assert rows["`memory`"].split(" | ")[1] == "verify_kernel"


def decision_figures(kld: float, same: float) -> dict:
    f = {k: 0.0 for k in ("kld_median", "kld_p99", "kld_p95", "kld_p90", "kld_p10", "kld_p5", "kld_p1")}
    f.update(scored_tokens=8192, kld_mean=kld, kld_mean_err=kld / 10, kld_p99_9=10 * kld, kld_max=20 * kld)
    f.update(same_top=same, same_top_err=0.001, rms_delta_p=1e-3, rms_delta_p_err=1e-5)
    f.update(ln_ppl_ratio=2e-4, ln_ppl_ratio_err=1e-5, ppl_truth=1.7, ppl_graph=1.7)
    return f


def test_the_decisions_table_gives_each_graph_and_place_with_its_bound(workspace):
    """Per graph: the CPU's and each GPU mode's figures, the floor once, and whether the place is enforced;
    a run without decision figures (synthetic) says so in one line."""
    assert readme.decisions_table(readme.read_metrics(workspace)).startswith("No decision figures in this run")
    bounds = {"cpu": {"max_kld_mean": 1e-6, "min_same_top": 0.999}}
    cpu = {
        "L": 64,
        "windows": 128,
        "scored_tokens": 8192,
        "places": {"cpu": decision_figures(3e-9, 1.0), "torch_float16": decision_figures(2e-4, 0.995)},
        "bounds": bounds,
        "enforced": ["cpu"],
    }
    atomic.write_json(workspace / layout.result_path("tflite_L64"), {"decision": cpu})
    gpu = {
        **cpu,
        "places": {"gpu_mixed": decision_figures(4e-4, 0.993), "torch_float16": decision_figures(2e-4, 0.995)},
        "bounds": {"gpu_mixed": {"max_kld_mean": 1e-3, "min_same_top": 0.99}},
        "enforced": [],
    }
    atomic.write_json(
        workspace / layout.gpu_result_path("gpu_row_L64"), {**GPU_RECORDS["gpu_row_L64"], "decision": gpu}
    )
    body = readme.decisions_table(readme.read_metrics(workspace)).splitlines()[2:]
    assert body == [
        "| row L=64 | LiteRT CPU | 8,192 | 3.0e-09 ± 3.0e-10 | 0.0e+00 | 3.0e-08 | 6.0e-08 | 100.00 % ± 0.10 % "
        "| 1.0e-03 | 2.0e-04 ± 1.0e-05 | 1.0e-06 / 99.90 % (enforced) |",
        "| row L=64 | GPU mixed | 8,192 | 4.0e-04 ± 4.0e-05 | 0.0e+00 | 4.0e-03 | 8.0e-03 | 99.30 % ± 0.10 % "
        "| 1.0e-03 | 2.0e-04 ± 1.0e-05 | 1.0e-03 / 99.00 % (recorded) |",
        "| row L=64 | floor: torch float16 | 8,192 | 2.0e-04 ± 2.0e-05 | 0.0e+00 | 2.0e-03 | 4.0e-03 "
        "| 99.50 % ± 0.10 % | 1.0e-03 | 2.0e-04 ± 1.0e-05 | - |",
    ]
    summary = readme.decision_summary_table(readme.read_metrics(workspace))
    assert "| LiteRT CPU | 1 | 8,192 | 3.0e-09 | 100.00 % | +2.0e-04 | 1.0e-06 / 99.90 % (enforced): met |" in summary
    assert "| GPU mixed | 1 | 8,192 | 4.0e-04 | 99.30 % | +2.0e-04 | 1.0e-03 / 99.00 % (recorded): met |" in summary
    assert "set **mixed**" in summary and "q8_0 1.36e-03 / 97.67 %" in summary
    gpu["places"]["gpu_mixed"] = decision_figures(4e-3, 0.993)  # over its bound: fp32 is the advice
    record = {**GPU_RECORDS["gpu_row_L64"], "decision": gpu}
    atomic.write_json(workspace / layout.gpu_result_path("gpu_row_L64"), record)
    summary = readme.decision_summary_table(readme.read_metrics(workspace))
    assert "(recorded): **not met**" in summary and "set **fp32**" in summary


def test_the_quantization_trace_table_gives_every_group_at_every_precision(tmp_path):
    """Each role and layer quantized alone, beside every Linear at once, at each traced precision; without the
    trace's record the render names the command that makes it."""
    doc = "<!-- generated: quantization_trace -->\n<!-- end generated: quantization_trace -->\n"
    with pytest.raises(ClefError, match="run `make quantization-trace` first"):
        readme.render(doc, tmp_path)

    def figures(kld, same):
        return {"kld_mean": kld, "same_top": same}

    def group(n, kld, same):
        return {"linears": n, "decision": figures(kld, same)}

    trace = {
        "source": "tiny",
        "L": 64,
        "scored_tokens": 8192,
        "measured_utc": "2026-12-07T12:00:00Z",
        "precisions": {
            w: {
                "all_linears": figures(k, 0.8),
                "by_role": {"mlp.down_proj": group(8, k / 4, 0.95)},
                "by_layer": {"0": group(7, k / 8, 0.97)},
            }
            for w, k in (("int8", 7.3e-4), ("int4", 0.27))
        },
    }
    atomic.write_json(tmp_path / layout.result_path("quantization_trace"), trace)
    text, _ = readme.render(doc, tmp_path)
    assert "| `int4`: mean KLD / same top | `int8`: mean KLD / same top |" in text, text  # the record's order
    assert "| every Linear | all | 2.7e-01 / 80.00 % | 7.3e-04 / 80.00 % |" in text, text
    assert "| `mlp.down_proj` | 8 | 6.8e-02 / 95.00 % | 1.8e-04 / 95.00 % |" in text, text
    assert "| layer 0 | 7 | 3.4e-02 / 97.00 % | 9.1e-05 / 97.00 % |" in text, text
    assert "layer 0's" not in text  # a trace from before the mixed recipes
    trace["precisions"]["int4"]["first_layer_kept"] = {"bf16": figures(0.08, 0.9), "int8": figures(0.09, 0.89)}
    trace["precisions"]["int8"]["first_layer_kept"] = {"bf16": figures(2e-4, 0.99)}
    atomic.write_json(tmp_path / layout.result_path("quantization_trace"), trace)
    text, _ = readme.render(doc, tmp_path)
    assert "| every Linear but layer 0's (bf16) | all | 8.0e-02 / 90.00 % | 2.0e-04 / 99.00 % |" in text, text
    assert "| every Linear, layer 0's at int8 | all | 9.0e-02 / 89.00 % | - |" in text, text


def test_the_host_tables_table_gives_each_precision_against_bf16_or_says_it_was_not_measured(tmp_path):
    block = "<!-- generated: host_tables -->\n<!-- end generated: host_tables -->\n"
    doc = {"measured_utc": "2026-12-07T15:00:00Z", "source": "tiny", "scored_tokens": 8192}
    atomic.write_json(tmp_path / layout.result_path("weights"), doc)
    assert "Not measured: this weights bench predates" in readme.render(block, tmp_path)[0]

    def held(size, kld, top):
        return {"bytes": size, "decision": {"kld_mean": kld, "same_top": top, "ln_ppl_ratio": 0.0}}

    doc["host_tables"] = {"bf16": held(1000, 0.0, 1.0), "int4b32": held(281, 0.05, 0.9)}
    atomic.write_json(tmp_path / layout.result_path("weights"), doc)
    text = readme.render(block, tmp_path)[0]
    assert "| `int4b32` | 281 (0.281x) | 5.0e-02 / 90.00 % / +0.0e+00 | `q4_K_M` 3.1e-02 / 91.90 % |" in text, text
    assert text.index("`bf16`") < text.index("`int4b32`")  # the largest first
    assert "| `bf16` | 1,000 (1.000x) |" in text and "8,192 held-out tokens" in text
