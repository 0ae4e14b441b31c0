"""DVC stage `release`: the graphs (release.layout `bundle`: the bundle stage's one .tflite holding every
row and pair signature; `files`: each row graph and pair), host files, reference records (computed by the
verify stages, which hold the torch model already: this stage loads no model), model card and
manifest -> artifacts/release/, its tarball -> artifacts/dist/<model>-<revision>-<form>.tar.zst, and the
by-length tables `dvc plots show` draws -> results/plots/.

With params.yaml `release.signing_key` set, the release directory, manifest included, is signed with
that key (scripts/release/signing.py) before either output is swapped in.

Runs no graph: each reference record's figures are the ones its verify stage measured running that
record, read back from disk, through the graph (scripts/release/references.py); the record's sha256
ties the two.

Refuses, before building anything, a signing key that cannot sign, an artifact that is missing, whose
metadata names another revision, form or shape, whose verify stage did not pass or left no reference
record or figures; a bundle whose graphs or signatures are not the params' lengths and pairs, that did
not pass its stage, or that was made from other files than the graphs there now; and as it packages
each, a reference record that is not the one measured, or whose error is over the threshold its verify
stage held it to. A refusal leaves the previous release and tarball in place and no build directory.
"""

import shutil
from pathlib import Path

from scripts.checkpoint import snapshot
from scripts.checks import bundle_check
from scripts.layers import kernel_form
from scripts.litert import bundle, tflite_file
from scripts.pipeline import atomic, layout, params, pictures, provenance
from scripts.pipeline.errors import ClefError
from scripts.pipeline.harness import run_stage
from scripts.qwen35.host import Host
from scripts.release import builder, card, reader, signing


def graph_bounds(p: dict, section: str, what: str) -> dict[str, float]:
    """The bounds a graph's verify stage held it to -> {"global", "per_position"}: its reference record's too."""
    found = params.bounds(p, section, (f"rel_{what}", f"rel_per_position_{what}"))
    return {"global": found[f"rel_{what}"], "per_position": found[f"rel_per_position_{what}"]}


def planned(p: dict) -> list[dict]:
    """The artifacts params.yaml asks for (bundle_check.planned: name, kind, shape, file, signature
    names), each with the checks that vouch for it."""
    out = []
    for g in bundle_check.planned(p["lengths"], p["pairs"]):
        if g.kind == "row":
            gpu = layout.gpu_name(g.shape["L"])
            checks, bounds = [f"tflite_L{g.shape['L']}", f"export_L{g.shape['L']}", gpu], ("verify_tflite", "vs_torch")
        else:
            gpu = layout.gpu_name(prefix=g.shape["P"], suffix=g.shape["S"])
            checks, bounds = [g.name, f"export_{g.name}", gpu], ("verify_pair", "vs_row")
        out.append(
            {
                "name": g.name,
                "kind": g.kind,
                "shape": g.shape,
                "path": g.path,
                "signatures": g.signatures,
                "gpu": gpu,
                "checks": checks,
                "bounds": graph_bounds(p, *bounds),
            }
        )
    return out


GPU_FIGURES = (
    "fully_accelerated",
    "layers_checked",
    "layers",
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
    "modes",
    "positions",
    "device",
)


PICTURES = "pictures"  # the card's charts, in the release (scripts/pipeline/pictures.py)


def gpu_section(name: str) -> dict:
    """What verify_gpu measured for one graph on LiteRT's GPU accelerator, and the device that ran it."""
    doc = layout.read_record(layout.gpu_result_path(name))
    if "refused" in doc:  # int8 weights (stages/verify_gpu.py refused)
        return {"fully_accelerated": False, "refused": doc["refused"]}
    return {k: doc[k] for k in GPU_FIGURES}


def read_metrics(name: str) -> dict:
    return layout.read_record(layout.metrics_path(name))


def preflight(items: list[dict], rec: dict, form: str, weights: str) -> None:
    """Everything the release will vouch for is there, verified, and of this revision, form and weights."""
    for it in items:
        graph = layout.require(it["path"])
        layout.require(layout.reference_path(graph))
        layout.require(layout.reference_figures_path(graph))
        want = {"revision": rec["revision"], "form": form, "weights": weights, "kind": it["kind"], **it["shape"]}
        meta = tflite_file.read_metadata(graph)
        bad = tflite_file.metadata_mismatches(meta, want)
        if bad:
            raise ClefError(f"{it['path']}: metadata {'; '.join(bad)}; rerun its export stage")
        for check in it["checks"]:
            m = read_metrics(check)
            if m.get("passed") is False:
                raise ClefError(f"{it['path']}: check {check} did not pass; not releasing it")
        it["metadata"], it["census"] = meta, tflite_file.census(graph)


def bundle_preflight(items: list[dict], rec: dict, form: str, weights: str) -> Path:
    """The bundle holds exactly the graphs params.yaml asks for, under the signature names layout gives
    them, made from the graph files there now, and passed its stage -> its path."""
    path = layout.require(layout.bundle_path(rec, form, weights), "bundle")
    meta = tflite_file.read_metadata(path) or {}
    want = {"kind": "bundle", "revision": rec["revision"], "form": form, "weights": weights}
    bad = tflite_file.metadata_mismatches(meta, want)
    if bad:
        raise ClefError(f"{path}: metadata {'; '.join(bad)}; rerun the bundle stage")
    graphs = meta.get("graphs") or {}
    want = {it["name"] for it in items}
    if set(graphs) != want:
        raise ClefError(
            f"{path} holds graphs {sorted(graphs)}, params.yaml asks for {sorted(want)}: rerun the bundle stage"
        )
    have = set(tflite_file.census(path)["signatures"])
    named = {n for it in items for n in it["signatures"].values()}
    if have != named:
        raise ClefError(
            f"{path}: signatures {sorted(have ^ named)} are missing or not asked for: rerun the bundle stage"
        )
    for it in items:
        if bundle.fingerprint(it["path"]) != graphs[it["name"]].get("file"):
            raise ClefError(
                f"{it['path']} is not the file the bundle {path.name} was made from: rerun the bundle stage"
            )
    if read_metrics("bundle").get("passed") is not True:
        raise ClefError(f"{path}: the bundle stage's checks did not pass; not releasing it")
    return path


def place_graphs(items: list[dict], build: Path, lock: dict, mode: str, merged: Path | None) -> dict[str, dict]:
    """The graph files into the release, each hashed once -> {graph name: the file holding it: its
    release path, digests, bytes, the dvc.lock stage and md5 that produced it, and the graph's
    signature names in it}."""
    holders = {}
    if mode == "bundle":
        rel = f"bundle/{merged.name}"
        builder.place(merged, build / rel)
        held = {"file": rel, **builder.graph_digests(build / rel), "bytes": (build / rel).stat().st_size}
        held["dvc_lock"] = {"stage": "bundle", "md5": lock.get("bundle", {}).get("outs", {}).get(str(layout.BUNDLE))}
        return {it["name"]: {**held, "signature_names": it["signatures"]} for it in items}
    for it in items:
        rel = f"{it['kind']}s/{it['path'].name}"
        builder.place(it["path"], build / rel)
        stage = next((n for n, st in lock.items() if str(it["path"]) in st["outs"]), None)
        holders[it["name"]] = {
            "file": rel,
            **builder.graph_digests(build / rel),
            "bytes": (build / rel).stat().st_size,
            "dvc_lock": {"stage": stage, "md5": lock[stage]["outs"][str(it["path"])] if stage else None},
            "signature_names": {k: k for k in it["census"]["signatures"]},
        }
    return holders


def artifact_entry(it: dict, held: dict, build: Path, form: str, max_over_recorded: float) -> tuple[dict, dict]:
    """One graph into the release: `held`, the file that holds it (place_graphs), with the reference
    record its verify stage computed (results/references/) and the figures that stage measured running
    it through the graph, held to the bounds that stage held the graph to; -> its manifest entry, and
    {path: sha256} of the files placed (hashed here, not again for the file table)."""
    rel_path = held["file"]
    check_file = f"checks/{it['path'].stem}.safetensors"
    record_path = layout.reference_path(it["path"])
    builder.place(record_path, build / check_file)
    figures_path = layout.reference_figures_path(it["path"])
    measured = layout.read_record(figures_path)
    if snapshot.sha256_file(build / check_file) != measured["record_sha256"]:
        stage = layout.producer_of(record_path)
        raise ClefError(f"{record_path} is not the record {stage} measured ({figures_path}); rerun {stage}")
    bounds = it["bounds"]
    reference = {
        "file": check_file,
        "max_rel": measured["rel_vs_expected"],
        "threshold": bounds["global"],
        "max_rel_per_position": measured["rel_per_position_vs_expected"],
        "threshold_per_position": bounds["per_position"],
        "max_over_recorded": max_over_recorded,
        "positions": measured["per_position_vs_expected"],  # the figure at each position (the pictures)
    }
    found = reader.reference_problems(measured, reference)
    if found:
        raise ClefError(f"{rel_path}: reference record: {found[0]}")
    contract = it["metadata"]["contract"]
    return (
        {
            "kind": it["kind"],
            **it["shape"],
            "form": form,
            "weights": it["metadata"]["weights"],
            "file": rel_path,
            "signature_names": held["signature_names"],
            "sha256": held["sha256"],
            "bytes": held["bytes"],
            "md5": held["md5"],
            "dvc_lock": held["dvc_lock"],
            "signatures": builder.signatures(it["census"], contract),
            "census": {k: it["census"][k] for k in ("op_total", "max_rank", "ops_per_gdn_layer", "dtypes")},
            "metadata": {k: v for k, v in it["metadata"].items() if k != "contract"},
            "contract": {k: v for k, v in contract.items() if k not in ("inputs", "outputs", "signatures")},
            "verification": {c: read_metrics(c) for c in it["checks"]},
            "gpu": gpu_section(it["gpu"]),
            "reference": reference,
        },
        {rel_path: held["sha256"], check_file: measured["record_sha256"]},
    )


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
    signed: dict,
    bundled: dict | None,
) -> dict:
    return {
        "format": reader.FORMAT,
        "name": name,
        "layout": p["release"]["layout"],
        "bundle": bundled,
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
        "weights": p["weights"],
        "params": p,
        "versions": provenance.package_versions(),
        "git": provenance.git_state(),
        "host": host_section,
        "artifacts": artifacts,
        "verification": overall,
        "stages": lock,
        "files": files,
        "signing": signed,
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


def bundle_section(held: dict) -> dict:
    """What the bundle stage measured of the bundle the release ships (results/bundle.json)."""
    doc = layout.read_record(layout.result_path("bundle"), "bundle")
    identity = {}
    for r in doc["identity"]:
        seen = identity.setdefault(r["accelerator"], {"identical": True, "signatures_run": 0})
        seen["identical"] = seen["identical"] and r["identical"]
        seen["signatures_run"] += 1
    return {
        "file": held["file"],
        "bytes": held["bytes"],
        "sha256": held["sha256"],
        **{
            k: doc[k]
            for k in (
                "signatures",
                "sharing",
                "largest_graph",
                "bytes_over_graph",
                "duplicate_constants",
                "memory",
                "census",
            )
        },
        "identity_vs_own_file": identity,
        "gpu_checked": doc["gpu_checked"],
        "gpu_not_checked_why": doc["gpu_not_checked_why"],
    }


def build(
    build_dir: Path,
    dist_dir: Path,
    p: dict,
    items: list[dict],
    rec: dict,
    snap: Path,
    form: str,
    overall: dict,
    key,
    merged: Path | None,
) -> dict:
    """The release into build_dir (signed when `key`, the loaded release.signing_key, is not None) and
    its tarball into dist_dir -> the manifest."""
    host = Host(snap)
    build_dir.mkdir(parents=True)
    host_section = builder.host_files(snap, host, build_dir, p["release"]["host_weights"])
    lock = builder.lock_stages()
    holders = place_graphs(items, build_dir, lock, p["release"]["layout"], merged)
    artifacts, hashed = {}, {}
    for i, it in enumerate(items, 1):
        print(f"release [{i}/{len(items)}] {it['name']}: reference record", flush=True)
        held = holders[it["name"]]
        entry, digests = artifact_entry(it, held, build_dir, form, p["release"]["max_over_recorded"])
        artifacts[it["name"]] = entry
        hashed |= digests
    name = layout.release_name(rec, form, p["weights"])
    signed = signing.section(key)
    bundled = bundle_section(next(iter(holders.values()))) if merged is not None else None
    shown = {}
    for file, (title, drawn) in pictures.release_pictures(artifacts).items():
        atomic.write_text(build_dir / PICTURES / file, drawn)
        shown[f"{PICTURES}/{file}"] = title
    theirs = card.checkpoint_card(snap)
    atomic.write_text(
        build_dir / reader.CARD,
        card.render(name, rec, form, p["weights"], host_section, artifacts, overall, signed, bundled, theirs, shown),
    )
    files = builder.file_table(build_dir, hashed)
    manifest = manifest_of(name, rec, form, p, host_section, artifacts, overall, lock, files, signed, bundled)
    atomic.write_json(build_dir / reader.MANIFEST, manifest)
    if key is not None:
        signing.sign(build_dir, p["release"]["signing_key"], name)
    builder.write_tarball(build_dir, dist_dir / f"{name}{builder.TARBALL_SUFFIX}", name)
    return manifest


def main() -> None:
    p = params.load(["model", "form", "weights", "lengths", "pairs", "release", "verify_tflite", "verify_pair"])
    form = str(kernel_form.parse(p["form"]))
    builder.check_host_weights(p["release"]["host_weights"])
    key_path = p["release"]["signing_key"]  # a key that cannot sign is refused before any work
    key = signing.load_private_key(key_path, repo=Path.cwd()) if key_path else None
    items = planned(p)
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    preflight(items, rec, form, p["weights"])
    merged = bundle_preflight(items, rec, form, p["weights"]) if p["release"]["layout"] == "bundle" else None
    overall = {n: read_metrics(n) for n in ("kernel", "layers", "model", "stack", "kernel_bench", "export_bench")}
    if not all(overall[n].get("passed", True) for n in overall):
        raise ClefError(f"a check did not pass: {[n for n in overall if overall[n].get('passed') is False]}")

    build_dir, dist_dir = atomic.partial_dir(layout.RELEASE), atomic.partial_dir(layout.DIST)
    for d in (build_dir, dist_dir):
        shutil.rmtree(d, ignore_errors=True)
    try:
        manifest = build(build_dir, dist_dir, p, items, rec, snap, form, overall, key, merged)
        # the release and its tarball are replaced together, or neither is
        atomic.swap_in_dirs([(build_dir, layout.RELEASE), (dist_dir, layout.DIST)])
    finally:  # nothing half-built stays behind, whatever stopped the build
        for d in (build_dir, dist_dir):
            shutil.rmtree(d, ignore_errors=True)
    plot_tables(manifest["artifacts"])
    git, sig = manifest["git"], manifest["signing"]
    print(
        f"release: {layout.RELEASE} ({len(manifest['files'])} files, {len(manifest['artifacts'])} graphs, "
        f"{'signed by ' + sig['key_fingerprint'] if sig['signed'] else 'unsigned'}), "
        f"{layout.DIST / (manifest['name'] + builder.TARBALL_SUFFIX)}; git {git['commit'] and git['commit'][:12]}"
        f"{'' if git['clean'] else ' (uncommitted changes: ' + ', '.join(git['changed'][:5]) + ')'}"
    )


if __name__ == "__main__":
    run_stage(main)
