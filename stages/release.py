"""DVC stage `release`: the graphs, host files, reference records, model card and manifest ->
artifacts/release/ (signed when params.yaml release.signing_key is set), its tarball ->
artifacts/dist/<model>-<revision>-<form>.tar.zst, and the by-length tables `dvc plots show` draws ->
results/plots/ (scripts/release/assemble.py). Runs no graph and loads no model.

Refuses, before building anything, a signing key that cannot sign and every input
scripts/release/preflight.py refuses; a refusal, or one while building (a reference record that is not
the one measured or is over its bounds), leaves the previous release and tarball in place and no
build directory.
"""

import shutil
from pathlib import Path

from scripts.checkpoint import snapshot
from scripts.layers import kernel_form
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.harness import run_stage
from scripts.release import assemble, builder, plan, preflight, signing


def main() -> None:
    p = params.load(["model", "form", "weights", "lengths", "pairs", "release", "verify_tflite", "verify_pair"])
    form = str(kernel_form.parse(p["form"]))
    builder.check_host_weights(p["release"]["host_weights"])
    key_path = p["release"]["signing_key"]  # a key that cannot sign is refused before any work
    key = signing.load_private_key(key_path, repo=Path.cwd()) if key_path else None
    planned = plan.planned(p)
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    graphs = preflight.graphs(planned, rec, form, p["weights"])
    bundled = p["release"]["layout"] == "bundle"
    merged = preflight.bundle_file(planned, rec, form, p["weights"]) if bundled else None
    overall = preflight.overall()

    build_dir, dist_dir = atomic.partial_dir(layout.RELEASE), atomic.partial_dir(layout.DIST)
    for d in (build_dir, dist_dir):
        shutil.rmtree(d, ignore_errors=True)
    try:
        manifest = assemble.build(build_dir, dist_dir, p, graphs, rec, snap, form, overall, key, merged)
        # the release and its tarball are replaced together, or neither is
        atomic.swap_in_dirs([(build_dir, layout.RELEASE), (dist_dir, layout.DIST)])
    finally:  # nothing half-built stays behind, whatever stopped the build
        for d in (build_dir, dist_dir):
            shutil.rmtree(d, ignore_errors=True)
    assemble.plot_tables(manifest.artifacts)
    git, sig = manifest.git, manifest.signing
    print(
        f"release: {layout.RELEASE} ({len(manifest.files)} files, {len(manifest.artifacts)} graphs, "
        f"{'signed by ' + sig.key_fingerprint if sig.signed else 'unsigned'}), "
        f"{layout.DIST / (manifest.name + builder.TARBALL_SUFFIX)}; git {git.commit and git.commit[:12]}"
        f"{'' if git.clean else ' (uncommitted changes: ' + ', '.join(git.changed[:5]) + ')'}"
    )


if __name__ == "__main__":
    run_stage(main)
