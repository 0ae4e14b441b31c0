"""DVC stage `release`: the row graphs and pairs, host files, reference records, model card and
manifest -> artifacts/release/, its tarball -> artifacts/dist/<model>-<revision>-<form>.tar.gz, and the
by-length tables `dvc plots show` draws -> results/plots/.

Refuses, before building anything, an artifact that is missing, whose metadata names another
revision, form or shape, or whose verify stage did not pass; and after running each reference
record, one whose error is over the threshold its verify stage held it to.
"""

import shutil
from pathlib import Path

from scripts.checkpoint import snapshot
from scripts.checks import model_check
from scripts.layers import kernel_form
from scripts.litert import tflite_file
from scripts.pipeline import atomic, layout, params, provenance
from scripts.pipeline.errors import ClefError, run_stage
from scripts.qwen35 import patch, row_graph
from scripts.qwen35.host import Host
from scripts.release import builder, card, reader

REFERENCE_SEED = 20261129


def graph_bounds(p: dict, section: str, what: str) -> dict[str, float]:
    """The bounds a graph's verify stage held it to -> {"global", "per_position"}: its reference record's too."""
    found = params.bounds(p, section, (f"rel_{what}", f"rel_per_position_{what}"))
    return {"global": found[f"rel_{what}"], "per_position": found[f"rel_per_position_{what}"]}


def planned(p: dict) -> list[dict]:
    """The artifacts params.yaml asks for, each with the checks that vouch for it."""
    out = [
        {
            "kind": "row",
            "shape": {"L": n},
            "path": layout.row_path(n),
            "gpu": layout.gpu_name(n),
            "checks": [f"tflite_L{n}", f"export_L{n}", layout.gpu_name(n)],
            "bounds": graph_bounds(p, "verify_tflite", "vs_torch"),
        }
        for n in p["lengths"]
    ]
    for q in p["pairs"]:
        name = layout.pair_name(q["prefix"], q["suffix"])
        gpu = layout.gpu_name(prefix=q["prefix"], suffix=q["suffix"])
        out.append(
            {
                "kind": "pair",
                "shape": {"P": q["prefix"], "S": q["suffix"]},
                "gpu": gpu,
                "path": layout.pair_path(q["prefix"], q["suffix"]),
                "checks": [name, f"export_{name}", gpu],
                "bounds": graph_bounds(p, "verify_pair", "vs_row"),
            }
        )
    return out


GPU_FIGURES = (
    "fully_accelerated",
    "fp32_max_rel_vs_torch",
    "threshold_fp32",
    "fp32_max_rel_per_position_vs_torch",
    "threshold_per_position_fp32",
    "fp16_max_rel_vs_f64",
    "fp16_max_rel_per_position_vs_f64",
    "floor_max_rel_vs_f64",
    "floor_max_rel_per_position_vs_f64",
    "fp16_over_floor",
    "fp16_target_over_floor",
    "fp16_within_target",
    "all_finite",
    "device",
)


def gpu_section(name: str) -> dict:
    """What verify_gpu measured for one graph on LiteRT's GPU accelerator, and the device that ran it."""
    doc = layout.read_record(layout.gpu_result_path(name))
    return {k: doc[k] for k in GPU_FIGURES}


def read_metrics(name: str) -> dict:
    return layout.read_record(layout.metrics_path(name))


def preflight(items: list[dict], rec: dict, form: str) -> None:
    """Everything the release will vouch for is there, verified, and of this revision and form."""
    for it in items:
        graph = layout.require(it["path"])
        want = {"revision": rec["revision"], "form": form, "kind": it["kind"], **it["shape"]}
        meta = tflite_file.read_metadata(graph)
        bad = tflite_file.metadata_mismatches(meta, want)
        if bad:
            raise ClefError(f"{it['path']}: metadata {'; '.join(bad)}; rerun its export stage")
        for check in it["checks"]:
            m = read_metrics(check)
            if m.get("passed") is False:
                raise ClefError(f"{it['path']}: check {check} did not pass; not releasing it")
        it["metadata"], it["census"] = meta, tflite_file.census(graph)


def reference_record(it: dict, model, host: Host) -> dict:
    """One fixed record per artifact: a right-padded row; a pair with a half-full prefix."""
    vocab = model.config.vocab_size
    if it["kind"] == "row":
        n = it["shape"]["L"]
        ids = model_check.random_ids(n - n // 3, vocab, REFERENCE_SEED + n)
        return builder.row_reference(row_graph.ClefRowPrefill(model, n).eval(), host.record(ids, n))
    P, S = it["shape"]["P"], it["shape"]["S"]
    p = max(1, P // 2)
    ids = model_check.random_ids(p + S, vocab, REFERENCE_SEED + P + S)
    return builder.pair_reference(
        row_graph.ClefRowPrefill(model, P + S).eval(),
        host.record(ids[:p], P),
        host.record(ids[p:], S, start=p),
        host.record(ids, P + S),
    )


def artifact_entry(it: dict, build: Path, model, host: Host, lock: dict, form: str) -> tuple[str, dict]:
    """One graph into the release: placed, its reference record written and rerun in the interpreter
    (held to the bounds its verify stage held the graph to), and its manifest entry."""
    from safetensors.torch import save_file

    rel_path = f"{it['kind']}s/{it['path'].name}"
    builder.place(it["path"], build / rel_path)
    record = reference_record(it, model, host)
    check_file = f"checks/{it['path'].stem}.safetensors"
    (build / "checks").mkdir(exist_ok=True)
    save_file(record, str(build / check_file))
    measured = reader.run_reference(build / rel_path, it["kind"], record)
    bounds = it["bounds"]
    reference = {
        "file": check_file,
        "max_rel": measured["rel_vs_expected"],
        "threshold": bounds["global"],
        "max_rel_per_position": measured["rel_per_position_vs_expected"],
        "threshold_per_position": bounds["per_position"],
    }
    found = reader.reference_problems(measured, reference)
    if found:
        raise ClefError(f"{rel_path}: reference record: {found[0]}")
    contract = it["metadata"]["contract"]
    export_stage = next((n for n, st in lock.items() if str(it["path"]) in st["outs"]), None)
    return rel_path, {
        "kind": it["kind"],
        **it["shape"],
        "form": form,
        "sha256": snapshot.sha256_file(build / rel_path),
        "bytes": (build / rel_path).stat().st_size,
        "md5": builder.md5_file(build / rel_path),
        "dvc_lock": {
            "stage": export_stage,
            "md5": lock[export_stage]["outs"][str(it["path"])] if export_stage else None,
        },
        "signatures": builder.signatures(it["census"], contract),
        "census": {k: it["census"][k] for k in ("op_total", "max_rank", "ops_per_gdn_layer", "dtypes")},
        "metadata": {k: v for k, v in it["metadata"].items() if k != "contract"},
        "contract": {k: v for k, v in contract.items() if k not in ("inputs", "outputs", "signatures")},
        "verification": {c: read_metrics(c) for c in it["checks"]},
        "gpu": gpu_section(it["gpu"]),
        "reference": reference,
    }


def manifest_of(
    name: str,
    rec: dict,
    form: str,
    p: dict,
    host_section: dict,
    artifacts: dict,
    overall: dict,
    lock: dict,
    files: dict,
) -> dict:
    return {
        "format": reader.FORMAT,
        "name": name,
        "model": {
            "repo": rec["repo"],
            "revision": rec["revision"],
            "source": rec["source"],
            "snapshot_files": {
                e["name"]: {"sha256": e["sha256"], "size": e["size"]}
                for e in sorted(rec["files"], key=lambda e: e["name"])
            },
        },
        "form": form,
        "params": p,
        "versions": provenance.package_versions(),
        "git": provenance.git_state(),
        "host": host_section,
        "artifacts": artifacts,
        "verification": overall,
        "stages": lock,
        "files": files,
    }


def plot_tables(artifacts: dict) -> None:
    """results/plots/: error and latency against L, error against P (`dvc plots show`)."""
    rows = []
    for a in sorted((a for a in artifacts.values() if a["kind"] == "row"), key=lambda a: a["L"]):
        v = a["verification"][f"tflite_L{a['L']}"]
        rows.append(
            {
                "L": a["L"],
                "max_rel_vs_torch": v["max_rel"],
                "litert_ms": v.get("litert_ms"),
                "torch_over_litert": v.get("torch_over_litert"),
                "ops_per_gdn_layer": v.get("ops_per_gdn_layer"),
            }
        )
    pairs = [
        {
            "P": a["P"],
            "S": a["S"],
            "max_rel_vs_row": a["verification"][layout.pair_name(a["P"], a["S"])]["max_rel"],
            "bytes": a["bytes"],
        }
        for a in sorted((a for a in artifacts.values() if a["kind"] == "pair"), key=lambda a: a["P"])
    ]
    atomic.write_json(layout.PLOTS / "rows.json", rows)
    atomic.write_json(layout.PLOTS / "pairs.json", pairs)


def main() -> None:
    p = params.load(["model", "form", "lengths", "pairs", "release", "verify_tflite", "verify_pair"])
    form = str(kernel_form.parse(p["form"]))
    mode = builder.check_host_weights(p["release"]["host_weights"])
    items = planned(p)
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    preflight(items, rec, form)
    overall = {n: read_metrics(n) for n in ("kernel", "layers", "model", "stack", "kernel_bench", "export_bench")}
    if not all(overall[n].get("passed", True) for n in overall):
        raise ClefError(f"a check did not pass: {[n for n in overall if overall[n].get('passed') is False]}")

    model, _, _ = patch.load(snap, form, progress=False)
    host = Host(snap)
    build = atomic.partial_dir(layout.RELEASE)
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    host_section = builder.host_files(snap, host, build, mode)
    lock = builder.lock_stages()
    artifacts = {}
    for i, it in enumerate(items, 1):
        print(f"release [{i}/{len(items)}] {it['path'].name}: reference record", flush=True)
        rel_path, entry = artifact_entry(it, build, model, host, lock, form)
        artifacts[rel_path] = entry
    name = builder.release_name(rec, form)
    atomic.write_text(build / reader.CARD, card.render(name, rec, form, host_section, artifacts, overall))
    files = builder.file_table(build)
    manifest = manifest_of(name, rec, form, p, host_section, artifacts, overall, lock, files)
    atomic.write_json(build / reader.MANIFEST, manifest)
    atomic.swap_in_dir(build, layout.RELEASE)

    dist = atomic.partial_dir(layout.DIST)
    shutil.rmtree(dist, ignore_errors=True)
    builder.write_tarball(layout.RELEASE, dist / f"{name}.tar.gz", name)
    atomic.swap_in_dir(dist, layout.DIST)
    plot_tables(artifacts)
    git = manifest["git"]
    print(
        f"release: {layout.RELEASE} ({len(files)} files, {len(artifacts)} graphs), "
        f"{layout.DIST / (name + '.tar.gz')}; git {git['commit'] and git['commit'][:12]}"
        f"{'' if git['clean'] else ' (uncommitted changes: ' + ', '.join(git['changed'][:5]) + ')'}"
    )


if __name__ == "__main__":
    run_stage(main)
