"""Assembling a release (the release stage), once scripts/release/preflight.py has found its inputs
sound: the graphs (release.layout `bundle`: the bundle stage's one .tflite holding every row and pair
signature; `files`: each row graph and pair), host files, reference records (computed by the verify
stages, which hold the torch model already: nothing here loads a model or runs a graph), the card's
pictures, the model card and the manifest -> the build directory, signed with release.signing_key when
it is set (scripts/release/signing.py), and its tarball; and the by-length tables `dvc plots show`
draws -> results/plots/.
"""

from __future__ import annotations

from pathlib import Path

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.pipeline import atomic, layout, pictures, provenance
from scripts.qwen35.host import Host
from scripts.release import builder, card, entries, reader, signing
from scripts.release.entries import HeldFile
from scripts.release.manifest import BUNDLE_FIGURES, Artifacts, BundleSection, Manifest, ModelSection
from scripts.release.preflight import CheckedGraph

PICTURES = "pictures"  # the card's charts, in the release (scripts/pipeline/pictures.py)


def bundle_section(held: HeldFile) -> BundleSection:
    """The manifest's `bundle` entry for the bundle file `held`, from results/bundle.json."""
    doc = layout.read_record(layout.result_path("bundle"), "bundle")
    identity = {}
    for r in doc["identity"]:
        seen = identity.setdefault(r["accelerator"], {"identical": True, "signatures_run": 0})
        seen["identical"] = seen["identical"] and r["identical"]
        seen["signatures_run"] += 1
    return BundleSection(
        held.file,
        held.bytes,
        held.sha256,
        **{k: doc[k] for k in BUNDLE_FIGURES},
        identity_vs_own_file=identity,
        gpu_checked=doc["gpu_checked"],
        gpu_not_checked_why=doc["gpu_not_checked_why"],
    )


def plot_tables(artifacts: Artifacts) -> None:
    """results/plots/: error and latency against L, error against P (`dvc plots show`)."""
    rows = []
    for a in sorted((a for a in artifacts.values() if a.kind == "row"), key=lambda a: a.L):
        v = a.verification[f"tflite_L{a.L}"]
        rows.append(
            {
                "L": a.L,
                "max_rel_vs_torch": v["max_rel"],
                "litert_ms": v.get("litert_ms"),
                "torch_over_litert": v.get("torch_over_litert"),
                "ops_per_gdn_layer": v.get("ops_per_gdn_layer"),
            }
        )
    pairs = [
        {
            "P": a.P,
            "S": a.S,
            "max_rel_vs_row": a.verification[layout.pair_name(a.P, a.S)]["max_rel"],
            "bytes": a.bytes,
        }
        for a in sorted((a for a in artifacts.values() if a.kind == "pair"), key=lambda a: a.P)
    ]
    atomic.write_json(layout.PLOTS / "rows.json", rows)
    atomic.write_json(layout.PLOTS / "pairs.json", pairs)


def build(
    build_dir: Path,
    dist_dir: Path,
    p: dict,
    graphs: list[CheckedGraph],
    rec: SnapshotRecord,
    snap: Path,
    form: str,
    overall: dict[str, dict],
    key,
    merged: Path | None,
) -> Manifest:
    """The release into build_dir (signed when `key`, the loaded release.signing_key, is not None) and
    its tarball into dist_dir -> the manifest."""
    build_dir.mkdir(parents=True)
    release = p["release"]
    host = builder.host_files(snap, Host(snap), build_dir, release["host_weights"], release["host_weights_precision"])
    lock = builder.lock_stages()
    holders = entries.place_graphs(graphs, build_dir, lock, p["release"]["layout"], merged)
    artifacts, hashed = {}, {}
    for i, c in enumerate(graphs, 1):
        print(f"release [{i}/{len(graphs)}] {c.graph.name}: reference record", flush=True)
        entry, digests = entries.artifact_entry(
            c, holders[c.graph.name], build_dir, form, p["release"]["max_over_recorded"]
        )
        artifacts[c.graph.name] = entry
        hashed |= digests
    name = layout.release_name(rec, form, p["weights"])
    signed = signing.section(key)
    bundled = bundle_section(next(iter(holders.values()))) if merged is not None else None
    shown, drawn = {}, {n: a.to_json() for n, a in artifacts.items()}  # the card and pictures read JSON
    for picture in pictures.release_pictures(drawn):
        atomic.write_text(build_dir / PICTURES / picture.file, picture.svg)
        shown[f"{PICTURES}/{picture.file}"] = picture.title
    drawn_card = card.render(
        name,
        rec,
        form,
        p["weights"],
        host.to_json(),
        drawn,
        overall,
        signed.to_json(),
        bundled.to_json() if bundled is not None else None,
        card.checkpoint_card(snap),
        shown,
    )
    atomic.write_text(build_dir / reader.CARD, drawn_card)
    files = builder.file_table(build_dir, hashed)
    manifest = Manifest(
        reader.FORMAT,
        name,
        p["release"]["layout"],
        bundled,
        ModelSection.of(rec),
        form,
        p["weights"],
        p,
        provenance.package_versions(),
        provenance.git_state(),
        host,
        artifacts,
        overall,
        lock,
        files,
        signed,
    )
    atomic.write_json(build_dir / reader.MANIFEST, manifest.to_json())
    if key is not None:
        signing.sign(build_dir, p["release"]["signing_key"], name)
    builder.write_tarball(build_dir, dist_dir / f"{name}{builder.TARBALL_SUFFIX}", name)
    return manifest
