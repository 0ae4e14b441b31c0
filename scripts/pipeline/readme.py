"""The figure tables of README.md and docs/*.md, rendered from the pipeline's own records so they
cannot go stale.

Each table sits in a document between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`
and names the run it came from (the release manifest's commit and whether the inputs were clean);
each NAME appears once across the documents. A block named `picture_NAME` holds an image link to
results/figures/NAME.svg, drawn from the same records (scripts/pipeline/pictures.py).
`make release` rewrites them after `dvc repro`; `make readme` alone rewrites them from the workspace
as it is.

    python -m scripts.pipeline.readme            # rewrite the generated tables and pictures
    python -m scripts.pipeline.readme --check    # exit 1 naming the tables that differ
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from scripts.bench.litert_benchmark import LatencyReport
from scripts.pipeline import atomic, layout, pictures
from scripts.pipeline.errors import ClefError, run_command
from scripts.pipeline.mappings import ForeignJson
from scripts.pipeline.metrics import MetricsRows
from scripts.release.manifest import Manifest

README = Path("README.md")
DOCS = Path("docs")  # the rest of the documentation, README's "Read next"


def documents(root: Path = Path(".")) -> list[Path]:
    """README.md and every docs/*.md, relative to `root`: the files whose blocks are generated."""
    return [README, *sorted(p.relative_to(root) for p in (root / DOCS).glob("*.md"))]


BLOCK = re.compile(r"(<!-- generated: (?P<name>\w+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)


def e(x) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def x(ratio) -> str:
    return "n/a" if ratio is None else f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x"


def read_metrics(root: Path) -> MetricsRows:
    """{check name: its metrics row} from results/metrics/, or one line saying the pipeline has not run.
    A GPU check's row gains its record's `modes` and `layers` (results/gpu/): the metrics row keeps the
    headline ratios only, so that `dvc metrics show` stays one readable table."""
    folder = root / layout.METRICS
    rows = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    if not rows:
        raise ClefError(f"no metrics under {folder}: run `dvc repro` first")
    for name, row in rows.items():
        record = root / layout.gpu_result_path(name)
        if name.startswith("gpu_") and record.is_file():
            found = json.loads(record.read_text())
            rows[name] = {
                **row,
                "modes": found.get("modes") or {},
                "layers": found.get("layers"),
                "decision": found.get("decision"),
            }
        record = root / layout.result_path(name)
        if name.startswith(("tflite_L", "pair_P")) and record.is_file():  # the decision figures: the record's
            rows[name] = {**row, "decision": json.loads(record.read_text()).get("decision")}
    bundle = root / layout.result_path("bundle")
    if "bundle" in rows and bundle.is_file():  # sizes, sharing, identity and memory: the stage's record
        rows["bundle"] = {**rows["bundle"], "record": json.loads(bundle.read_text())}
    return rows


def read_bench(root: Path) -> dict:
    path = root / layout.BENCH
    if not path.is_file():
        raise ClefError(f"no {path}: run `make real-width` (or `make bench`) first")
    bench = json.loads(path.read_text())
    missing = bench["clef_flash"].get("without_tiny_run") or []
    if missing:
        from scripts.bench import report

        raise ClefError(
            f"{path}: {report.UNEXTRAPOLATED} (`{'`, `'.join(missing[:3])}`{', ...' if len(missing) > 3 else ''})"
        )
    return bench


def read_manifest(root: Path) -> Manifest:
    """The release manifest of `root`'s last run: the tables name its commit, the pictures draw its figures."""
    from scripts.release import reader

    release = root / layout.RELEASE
    if not (release / reader.MANIFEST).is_file():
        raise ClefError(
            f"no {release / reader.MANIFEST}: the tables name the run that made the release; run `dvc repro` first"
        )
    return reader.load_manifest(release)


def run_line(manifest: Manifest) -> str:
    """Which run the figures are from: the release manifest's commit (the last stage of the run)."""
    git = manifest.git
    commit, clean = (git.commit or "unknown")[:7], git.clean
    state = "clean" if clean else "with uncommitted changes" if clean is False else "outside git"
    return f"From the `dvc repro` at commit {commit} ({state}); `results/metrics/`, rendered by `make readme`."


def by_shape(rows: dict, prefix: str) -> list[tuple[str, dict]]:
    """The rows whose name starts with `prefix`, ordered by their L, or by P then S."""
    picked = [(n, r) for n, r in rows.items() if n.startswith(prefix)]
    return sorted(picked, key=lambda nr: ("L" not in nr[1], nr[1].get("L", 0), nr[1].get("P", 0), nr[1].get("S", 0)))


def label(name: str, row: dict) -> str:
    if "L" in row:
        return f"row L={row['L']}"
    if "P" in row:
        return f"pair P={row['P']} S={row['S']}"
    return name


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body]) + "\n"


def checks_table(rows: MetricsRows) -> str:
    order = [
        ("kernel", "kernel vs float64 recurrence"),
        ("layers", "GatedDeltaNet layers vs stock float64"),
        ("model", "row graph (torch) vs stock float64"),
    ]
    named = [(n, r, title) for n, title in order if (r := rows.get(n))]
    named += [(n, r, f"{label(n, r)}: LiteRT vs torch") for n, r in by_shape(rows, "tflite_")]
    named += [(n, r, f"{label(n, r)}: chaining vs row") for n, r in by_shape(rows, "pair_")]
    named += [(n, r, f"{label(n, r)} on the GPU accelerator, fp32") for n, r in by_shape(rows, "gpu_")]
    body = [
        [
            title,
            "yes" if r.get("passed") else "**no**",
            e(r.get("max_rel")),
            e(r.get("max_rel_per_position")),
            f"{r.get('threshold', 0):g}, {r.get('threshold_per_position', 0):g}",
            x(r.get("control_over_threshold")),
        ]
        for n, r, title in named
    ]
    return table(["check", "passed", "global", "worst position", "bounds", "fault / bound"], body)


def rows_table(rows: MetricsRows) -> str:
    body = [
        [
            str(r["L"]),
            f"{r['bytes']:,}",
            str(r["op_total"]),
            str(r["ops_per_gdn_layer"]),
            str(r["max_rank"]),
            f"{r['litert_ms']:.1f} ms",
            x(r.get("torch_over_litert")),
        ]
        for _, r in by_shape(rows, "tflite_")
    ]
    return table(
        ["L", "bytes", "ops", "ops per GatedDeltaNet", "max rank", "LiteRT per record", "torch / LiteRT"], body
    )


def pairs_table(rows: MetricsRows) -> str:
    body = [
        [
            f"P={r['P']} S={r['S']}",
            f"{r['bytes']:,}",
            f"{e(r['max_rel'])} ({e(r['max_rel_per_position'])})",
            e(r.get("max_rel_state")),
            str(r["op_total"]),
        ]
        for _, r in by_shape(rows, "pair_")
    ]
    return table(["pair", "bytes", "vs row (worst position)", "prefix state vs float64 cache", "ops"], body)


def figure(value, fmt=e) -> str:
    """A figure, or "-" where the record has none (made before it was kept)."""
    return "-" if value is None else fmt(value)


def over_floor(value, per_position=None) -> str:
    """A ratio to the torch-float16 floor, global (per position); "-" where there is none."""
    if value is None:
        return "-"
    return f"{value:.1f}" + ("" if per_position is None else f" ({per_position:.1f})")


def gpu_table(rows: MetricsRows) -> str:
    """Per graph: fp32 against the graph in torch; the floor (stock transformers in torch float16) and the
    half modes (fp16, and mixed: fp16 storage, fp32 accumulation) against stock float64, with their ratios
    to the floor, from the check's record (read_metrics). A check recorded before verify_gpu ran mixed
    has "-" there."""
    gpu = by_shape(rows, "gpu_")

    def mode(r: dict, name: str) -> dict:
        return (r.get("modes") or {}).get(name) or {}

    fp16_per_position = any("over_floor_per_position" in mode(r, "fp16") for _, r in gpu)
    body = [
        [
            label(n, r),
            f"{r['layers_checked']} of {r['layers']}" if r.get("layers_checked") and r.get("layers") else "-",
            "yes" if r.get("fully_accelerated") else "**no**",
            f"{e(r.get('max_rel'))} ({e(r.get('max_rel_per_position'))})",
            figure(mode(r, "fp16").get("floor_max_rel_vs_f64", r.get("fp16_floor"))),
            figure(r.get("fp16_max_rel")),
            over_floor(r.get("fp16_over_floor"), mode(r, "fp16").get("over_floor_per_position")),
            figure(mode(r, "mixed").get("max_rel_vs_f64")),
            over_floor(mode(r, "mixed").get("over_floor"), mode(r, "mixed").get("over_floor_per_position")),
        ]
        for n, r in gpu
    ]
    return table(
        [
            "graph",
            "layers run",
            "fully accelerated",
            "fp32 vs torch (worst position)",
            "floor: torch float16",
            "fp16 vs float64",
            "fp16 / floor" + (" (per position)" if fp16_per_position else ""),
            "mixed vs float64",
            "mixed / floor (per position)",
        ],
        body,
    )


PLACES = {  # a decision record's place -> what it is, in the table
    "cpu": "LiteRT CPU",
    "gpu_fp32": "GPU fp32",
    "gpu_fp16": "GPU fp16",
    "gpu_mixed": "GPU mixed",
    "torch_float16": "floor: torch float16",
}


def with_err(value, err, fmt=e) -> str:
    return "-" if value is None else f"{fmt(value)} ± {fmt(err)}"


def percent(value) -> str:
    return f"{100 * value:.2f} %"


def decision_rows(rows: MetricsRows) -> list[tuple[str, str, dict, dict]]:
    """(graph, place, figures, its decision record) of every graph's decision record, CPU records first,
    each place once (the floor from the CPU record's run of the same windows)."""
    out, seen = [], set()
    for prefix in ("tflite_L", "pair_P", "gpu_"):
        for n, r in by_shape(rows, prefix):
            made = r.get("decision")
            if not made:
                continue
            graph = label(n, r)
            for place, f in made["places"].items():
                if (graph, place) not in seen:
                    seen.add((graph, place))
                    out.append((graph, place, f, made))
    order = list(PLACES)
    return sorted(out, key=lambda t: (rows_order(t[0]), order.index(t[1]) if t[1] in order else len(order)))


def rows_order(graph: str) -> tuple:
    """row graphs by L, then pairs by P and S (the label's numbers)."""
    numbers = tuple(int(n) for n in re.findall(r"\d+", graph))
    return (not graph.startswith("row"), *numbers)


def decisions_table(rows: MetricsRows) -> str:
    """Per graph and place: llama.cpp's KL-divergence statistics against stock float64 (the host's lm_head
    in float64) over held-out text, and the bound each place is held to (enforced) or recorded against."""
    body = []
    for graph, place, f, made in decision_rows(rows):
        bound = (made.get("bounds") or {}).get(place)
        held = (
            f"{e(bound['max_kld_mean'])} / {percent(bound['min_same_top'])}"
            + (" (enforced)" if place in made.get("enforced", []) else " (recorded)")
            if bound
            else "-"
        )
        body.append(
            [
                graph,
                PLACES.get(place, place),
                f"{f['scored_tokens']:,}",
                with_err(f["kld_mean"], f["kld_mean_err"]),
                e(f["kld_median"]),
                e(f["kld_p99_9"]),
                e(f["kld_max"]),
                f"{percent(f['same_top'])} ± {percent(f['same_top_err'])}",
                e(f["rms_delta_p"]),
                with_err(f["ln_ppl_ratio"], f["ln_ppl_ratio_err"]),
                held,
            ]
        )
    if not body:
        return "No decision figures in this run (model.source synthetic: random weights).\n"
    return table(
        [
            "graph",
            "place",
            "tokens",
            "mean KLD",
            "median KLD",
            "KLD 99.9 %",
            "max KLD",
            "same top",
            "RMS Δp",
            "ln PPL ratio",
            "bound: KLD / same top",
        ],
        body,
    )


def decision_summary_table(rows: MetricsRows) -> str:
    """Per place, over every graph: the worst mean KLD, the lowest same-top share, the largest ln PPL ratio,
    the bound and whether every graph met it; then the GPU mode the figures point to (docs/decisions.md
    has every graph)."""
    from scripts.checks import llama_cpp

    by_place: dict[str, list[tuple[dict, dict]]] = {}
    for _, place, f, made in decision_rows(rows):
        by_place.setdefault(place, []).append((f, made))
    if not by_place:
        return "No decision figures in this run (model.source synthetic: random weights).\n"
    body, met = [], {}
    for place, found in by_place.items():
        bounds = [(made.get("bounds") or {}).get(place) for _, made in found]
        enforced = any(place in made.get("enforced", []) for _, made in found)
        ok = all(
            b is not None and f["kld_mean"] <= b["max_kld_mean"] and f["same_top"] >= b["min_same_top"]
            for (f, _), b in zip(found, bounds, strict=True)
        )
        met[place] = ok
        bound = next((b for b in bounds if b), None)
        body.append(
            [
                PLACES.get(place, place),
                str(len(found)),
                f"{min(f['scored_tokens'] for f, _ in found):,}",
                e(max(f["kld_mean"] for f, _ in found)),
                percent(min(f["same_top"] for f, _ in found)),
                f"{max(f['ln_ppl_ratio'] for f, _ in found):+.1e}",
                "-"
                if bound is None
                else f"{e(bound['max_kld_mean'])} / {percent(bound['min_same_top'])} "
                + ("(enforced)" if enforced else "(recorded)")
                + (": met" if ok else ": **not met**"),
            ]
        )
    advice = ""
    if "gpu_mixed" in met:
        advice = (
            "\nOn the GPU, set **mixed** (fp16 storage, fp32 accumulation): its decisions meet their bound on "
            "every graph. fp32 where a runtime lacks mixed (LiteRT < 2.2) or CPU agreement to float32 rounding "
            "is wanted.\n"
            if met["gpu_mixed"]
            else "\nOn the GPU, set **fp32**: mixed misses its decision bound on at least one graph "
            "(docs/decisions.md).\n"
        )
    scale = "; ".join(f"{f.name} {f.kld_mean:.2e} / {percent(f.same_top)}" for f in llama_cpp.FIGURES)
    return (
        table(
            [
                "place",
                "graphs",
                "tokens each (at least)",
                "worst mean KLD",
                "lowest same top",
                "largest ln PPL ratio",
                "bound: KLD / same top",
            ],
            body,
        )
        + f"\nFor scale, llama.cpp's Llama-3-8B against fp16 (mean KLD / same top): {scale}.\n"
        + advice
    )


def export_bench_table(rows: MetricsRows) -> str:
    r = rows["export_bench"]
    stock_ops = r["ops_per_gdn_layer"] * r["gdn_ops_stock_over_form"]
    body = [
        [
            str(r["L"]),
            f"{r['ops_per_gdn_layer']} (stock: {stock_ops:.0f})",
            x(r["gdn_ops_stock_over_form"]),
            x(r["convert_time_stock_over_form"]),
            x(r["litert_time_stock_over_form"]),
        ]
    ]
    return table(["L", "ops per GatedDeltaNet", "stock / form: ops", "conversion time", "interpreter time"], body)


def gib(value) -> str:
    return "n/a" if value is None else f"{value:.1f} GiB"


def seconds(value) -> str:
    return "n/a" if value is None else f"{value:,.0f} s"


def real_width_table(bench: dict) -> str:
    """Per stage: the tiny run, the real-width run (measured) and clef-flash (extrapolated)."""
    tiny, real, clef = bench["tiny"]["stages"], bench["real_width"]["stages"], bench["clef_flash"]["stages"]
    order = sorted(real, key=lambda n: real[n]["finished_utc"])
    body = []
    for n in order:
        r, t, c = real[n], tiny.get(n, {}), clef.get(n, {})
        budget = f" / {r['budget_gib']:.1f}" if "budget_gib" in r else ""
        within = "" if r.get("within_budget", True) else " **over**"
        body.append(
            [
                f"`{n}`",
                f"{seconds(t.get('seconds'))}, {gib(t.get('peak_anon_gib'))}",
                f"{seconds(r['seconds'])}, {gib(r['peak_rss_gib'])}, {gib(r.get('peak_anon_gib'))}{budget}{within}",
                f"{seconds(c.get('seconds'))}, {gib(c.get('peak_anon_gib'))}"
                + (f" (all 8x: {gib(c['peak_anon_gib_upper'])})" if "peak_anon_gib_upper" in c else ""),
            ]
        )
    for n in bench["real_width"].get("stages_not_finished", []):
        body.append([f"`{n}`", "", "**did not finish** (failed, or skipped after a failure)", ""])
    stages = table(
        [
            "stage",
            "tiny: time, peak anon",
            "real width (measured): time, peak RSS, peak anon / budget",
            "clef-flash (extrapolated): time, peak anon",
        ],
        body,
    )
    gpu = real_width_gpu_table(bench["real_width"].get("gpu") or {})
    return stages + (
        f"\nOn the GPU accelerator at real width, ratio to the torch-float16 floor:\n\n{gpu}" if gpu else ""
    )


def gpu_shape(name: str) -> dict:
    """A GPU record's name -> its shape: "gpu_row_L64" -> {"L": 64}, "gpu_pair_P64_S64" -> {"P": 64, "S": 64}."""
    found = re.fullmatch(r"gpu_row_L(\d+)|gpu_pair_P(\d+)_S(\d+)", name)
    if not found:
        return {}
    L, P, S = found.groups()
    return {"L": int(L)} if L else {"P": int(P), "S": int(S)}


def real_width_gpu_table(gpu: dict) -> str:
    """bench.json's real_width.gpu (scripts/bench/report.py gpu_figures): per graph, fp16's and mixed's
    ratio to the floor, global (per position); "" for a bench made before it was kept."""
    if not gpu:
        return ""
    shaped = {n: {**g, **gpu_shape(n)} for n, g in gpu.items()}
    body = [
        [
            label(n, g),
            f"{g['layers_checked']} of {g['layers']}" if g.get("layers_checked") else "-",
            *(
                over_floor((g.get(mode) or {}).get("over_floor"), (g.get(mode) or {}).get("over_floor_per_position"))
                for mode in ("fp16", "mixed")
            ),
        ]
        for n, g in by_shape(shaped, "gpu_")
    ]
    return table(["graph", "layers run", "fp16 / floor (per position)", "mixed / floor (per position)"], body)


RELEASE_GOALS = {"bytes": 30e9, "seconds": 300}  # issue 35's goals for clef-flash's release and its stage


def release_row(clef: dict, run: dict) -> list[str]:
    """The release clef-flash would ship (the bundle, the host files) and the release stage's time."""
    stage = (run.get("stages") or {}).get("release", {}).get("seconds")
    if not clef.get("bundle_bytes"):
        return ["release", "not measured: the real-width run predates the bundle stage", "make real-width"]
    return [
        "release",
        f"the bundle {clef['bundle_bytes'] / 1e9:.1f} GB, the release {clef['release_bytes'] / 1e9:.1f} GB "
        f"(goal <= {RELEASE_GOALS['bytes'] / 1e9:.0f} GB); the release stage "
        + (f"{stage / 60:.1f} min (goal <= {RELEASE_GOALS['seconds'] / 60:.0f})" if stage else "not measured"),
        f"extrapolated: {clef['blocks']} x the real-width bundle, + "
        + (
            "clef-flash's host tables (at its vocabulary, not the synthetic checkpoint's) and the run's other "
            "files (tokenizer, reference records: the same at any depth)"
            if clef.get("release_bytes_by_weights_and_host")
            else "its host files and reference records (the same at any depth)"
        )
        + "; the stage as the others",
    ]


def real_run_table(bench: dict) -> str:
    """What the real clef-flash needs, each figure marked measured or extrapolated."""
    real, clef = bench["real_width"], bench["clef_flash"]
    run = clef["default_pipeline"]
    blocks = clef["blocks"]
    graphs = len(run["lengths"]) + len(run["pairs"])
    per_graph = clef["row_graph_bytes_per_L"]
    bundled = real.get("bundle")  # None: a real-width run from before the bundle stage
    packed = bundled["bytes"] if bundled else real.get("graph_bytes")  # what the tarball holds
    ratio = real["tarball_bytes"] / packed if packed else None
    # + one scratch graph: stages run one at a time, and export shifts its converted file in place
    shipped = clef["bundle_bytes"] if bundled else graphs * per_graph
    disk = clef["snapshot_bytes"] + graphs * per_graph + (per_graph if bundled else 0) + shipped * (ratio or 0)
    disk += per_graph
    ops = real["ops_per_gdn_layer"]
    within = "within" if run["within_budget"] else "**over**"
    missing = real.get("stages_not_finished") or []
    partial = f" (without {', '.join(f'`{n}`' for n in missing)}: they did not finish at real width)" if missing else ""
    body = [
        [
            "download",
            f"{clef['snapshot_bytes'] / 1e9:.1f} GB (bf16, vision and MTP included)",
            "the hub's file list",
        ],
        [
            "RAM",
            f"{run['peak_anon_gib']:.1f} GiB peak anonymous memory (`{run['peak_anon_stage']}`), {within} the "
            f"budget {run['memory_budget_gib']:.1f} GiB (params.yaml `memory` on the "
            f"{clef['fp32_stack_bytes'] / 2**30:.1f} GiB fp32 stack){partial}",
            f"extrapolated: the real-width figure + {blocks - 1} x the weights it holds (up to one stack copy)",
        ],
        [
            "time",
            f"{run['hours']:.1f} h on {bench['machine']['cores']} cores for the default {len(run['lengths'])} L and "
            f"{len(run['pairs'])} pairs, download excluded"
            + (
                f", of which {run['gpu_hours']:.1f} h `verify_gpu` on the software GPU (lavapipe)"
                + (
                    f" ({run['accelerator_hours']:.1f} h of it compiling for the accelerator and running on it; "
                    f"{run['hours'] - run['accelerator_hours']:.1f} h without that)"
                    if run.get("accelerator_hours") is not None
                    else ""
                )
                if run.get("gpu_hours")
                else ""
            )
            + partial,
            f"extrapolated: each stage's start-up (its imports) + {blocks} x the rest of its real-width time (an "
            "upper bound), L and pairs the run did not have "
            "interpolated; the first-block benchmark and the kernel stages as measured",
        ],
        release_row(clef, run),
        [
            "disk per graph",
            f"{per_graph / 1e9:.1f} GB; the tarball {ratio:.2f} x what it packs"
            if ratio
            else f"{per_graph / 1e9:.1f} GB",
            f"extrapolated: {blocks} x the real-width row graph"
            + ("; the real-width tarball ratio (measured)" if ratio else "; no tarball measured (no release)"),
        ],
        [
            "disk, default params",
            f"~{disk / 1e9:.0f} GB: snapshot + {graphs} graphs + "
            + ("the bundle + " if bundled else "")
            + ("tarball + " if ratio else "")
            + "a scratch graph (verify_gpu's sections; export's copy where the filesystem cannot shift a file in place)"
            + ("" if ratio else ", and the tarball (not measured)"),
            "sum of the above",
        ],
        [
            "ops per GatedDeltaNet",
            ", ".join(f"{v} at L={k}" for k, v in sorted(ops.items(), key=lambda kv: int(kv[0]))),
            "measured at real width (the graph's op count does not grow with the layer count)",
        ],
    ]
    return table(["need", "figure", "from"], body)


# clef-flash's release goals: issue 36's (the default, int8), issue 52's (int4: graphs and host tables together)
WEIGHTS_RELEASE_GOALS = {"default": 15e9, "int8": 8e9, "int4": 5e9}


def real_weights_table(bench: dict) -> str:
    """Each weights precision at real width (the weights bench in make real-width's workspace): the L=64
    row graph's bytes, conversion error, CPU speed and what the GPU accelerator takes, and the clef-flash
    release each would give (extrapolated) against the goals."""
    w = bench["real_width"].get("weights")
    if not w:
        return "Not measured: the real-width run predates the weights bench (`make real-width`)."
    default = (bench["tiny"].get("params") or {}).get("weights")
    releases = bench["clef_flash"].get("release_bytes_by_weights") or {}
    with_host = bench["clef_flash"].get("release_bytes_by_weights_and_host") or {}
    body = []
    for name, v in sorted(w["variants"].items(), key=lambda nv: -nv[1]["bytes"]):
        goal = WEIGHTS_RELEASE_GOALS.get("default" if name == default else name.split("_")[0].split("b")[0])
        release = releases.get(name)
        hosts = dict(
            sorted(((hp, b) for hp, b in (with_host.get(name) or {}).items() if hp != "bf16"), key=lambda x: -x[1])
        )
        body.append(
            [
                f"`{name}`" + (" (default)" if name == default else ""),
                f"{v['bytes'] / 1e9:.2f} GB ({w['bytes_over_fp32'][name]:.3f}x)",
                f"{e(v['conversion_max_rel'])} / {e(v['conversion_max_rel_per_position'])}"
                + (f"; exact form {e(v['exact_form_max_rel'])}" if v.get("exact_form_max_rel") is not None else ""),
                f"{v['litert_median_s']:.2f} s ({w['litert_speedup_over_fp32'][name]:.2f}x); "
                f"{v['fraction_of_peak']:.2f} of peak; torch eager {v['torch_median_s']:.2f} s"
                + (
                    f"; litert-benchmark {v['litert_benchmark_median_ms'] / 1e3:.2f} s"
                    if v.get("litert_benchmark_median_ms")
                    else ""
                ),
                gpu_cell(v.get("gpu")),
                (
                    f"{release / 1e9:.1f} GB"
                    + (
                        f"; host tables {', '.join(f'{hp} {b / 1e9:.1f} GB' for hp, b in hosts.items())}"
                        if hosts
                        else ""
                    )
                    + (f" (goal <= {goal / 1e9:.0f} GB)" if goal else "")
                )
                if release
                else "n/a",
            ]
        )
    header = [
        "weights",
        f"row graph L={w['L']}",
        "conversion error (CPU; global / per position)",
        "LiteRT CPU per record (x fp32)",
        "GPU accelerator",
        "clef-flash release (extrapolated; host tables bf16, then at each other precision)",
    ]
    return table(header, body)


def real_profile_table(bench: dict) -> str:
    """The default clef-flash pipeline's extrapolated hours by stage family, cut into the parts its stages
    timed (scripts/pipeline/profile.py); `other` is the rest of each stage's time (start-up included)."""
    from scripts.pipeline import profile

    run = bench["clef_flash"].get("default_pipeline") or {}
    stages = run.get("stages") or {}
    if not any(f.get("parts") for f in stages.values()):
        return "No profile: the run's stages predate their parts' timing (scripts/pipeline/profile.py)."
    families: dict[str, dict[str, float]] = {}
    for name, f in stages.items():
        family = families.setdefault(name.partition("@")[0], {"seconds": 0.0})
        family["seconds"] += f["seconds"]
        for part, s in (f.get("parts") or {}).items():
            family[part] = family.get(part, 0.0) + s
    parts = [p for p in profile.PARTS if any(p in f for f in families.values())]

    def hours(s: float) -> str:
        return f"{s / 3600:.2f}" if s >= 18 else "-"

    body = [
        [f"`{name}`", hours(f["seconds"]), *(hours(f.get(p, 0.0)) for p in parts)]
        + [hours(max(f["seconds"] - sum(f.get(p, 0.0) for p in parts), 0.0))]
        for name, f in sorted(families.items(), key=lambda kv: -kv[1]["seconds"])
    ]
    total = {p: sum(f.get(p, 0.0) for f in families.values()) for p in ["seconds", *parts]}
    body.append(
        ["**all**", hours(total["seconds"]), *(hours(total[p]) for p in parts)]
        + [hours(total["seconds"] - sum(total[p] for p in parts))]
    )
    return table(["stage", "hours", *parts, profile.OTHER], body)


BENCH_TABLES = {
    "real_width": real_width_table,
    "real_run": real_run_table,
    "real_weights": real_weights_table,
    "real_profile": real_profile_table,
}


def bench_line(bench: dict) -> str:
    """Which run, when, and on what: times are this CPU's (the matmul-bound stages scale with its peak)."""
    real = bench["real_width"]
    peak = ((bench.get("efficiency") or {}).get("matmul_peak") or {}).get("gflops")
    return (
        f"From `make real-width` at commit {real.get('commit') or 'unknown'} with `make bench` at "
        f"{bench['measured_utc']} ({bench['machine']['cpu']}, {bench['machine']['cores']} cores"
        + (f", fp32 matmul peak {peak:.0f} GFLOP/s" if peak else "")
        + "); `results/bench.json`, rendered by `make readme`."
    )


def mib(n) -> str:
    return f"{n / 2**20:.1f} MiB"


def bundle_table(rows: MetricsRows) -> str:
    """The bundle against the graphs it holds: size, sharing, identity per accelerator, memory."""
    row = rows.get("bundle")
    if not row or "record" not in row:
        raise ClefError("no results/bundle.json: run the bundle stage (`dvc repro`) first")
    r = row["record"]
    share, largest = r["sharing"], r["largest_graph"]
    identity: dict[str, list[bool]] = {}
    for i in r["identity"]:
        identity.setdefault(i["accelerator"], []).append(i["identical"])
    body = [
        [
            "bundle",
            f"{share['bytes']:,} bytes: {r['bytes_over_graph']:.3f}x the largest graph "
            f"(`{Path(largest['file']).name}`, {largest['bytes']:,}; goal {r['bytes_goal_over_graph']}x)",
        ],
        [
            "constants",
            f"{share['constant_bytes']:,} bytes stored once; the graphs held {share['part_constant_bytes']:,} "
            f"({share['part_constant_bytes'] / share['constant_bytes']:.1f}x)"
            + (
                f"; read back from the file, {r['duplicate_constants']['buffers']} stored twice"
                if "duplicate_constants" in r
                else ""
            ),
        ],
        ["signatures", f"{len(r['signatures'])}: " + ", ".join(f"`{n}`" for n in sorted(r["signatures"]))],
    ]
    for acc, same in identity.items():
        body.append(
            [
                f"identical to its own file, {acc.replace('gpu', 'GPU').replace('cpu', 'CPU')}",
                f"{sum(same)} of {len(same)} graphs",
            ]
        )
    if not r.get("gpu_checked"):
        body.append(["GPU", f"not run: {r.get('gpu_not_checked_why')}"])
    for acc, m in r["memory"].items():
        body.append(
            [
                f"memory held, every signature compiled and run once, {acc.upper()}",
                f"{mib(m['bundle']['held'])} vs {mib(m['largest_graph']['held'])} for the largest graph "
                f"({m['held_over_graph']:.2f}x; peak {m['peak_over_graph']:.2f}x; goal {r['memory_goal_over_graph']}x)",
            ]
        )
    return table(["bundle stage", "figure"], body)


def read_weights(root: Path) -> dict:
    path = root / layout.result_path("weights")
    if not path.is_file():
        raise ClefError(f"no {path}: run `make weights-bench` first")
    return json.loads(path.read_text())


def gpu_cell(gpu: dict | None) -> str:
    """A variant's GPU accelerator modes: compiled alone, its median seconds and worst error against
    torch, or the refusal."""
    if not gpu:
        return "not run"
    cells = []
    for mode, g in gpu.items():
        full = "" if g.get("fully_accelerated") else ", partly"
        if not g.get("compiled"):
            cells.append(f"{mode}: refused")
        elif g.get("run") is False:  # compiled section by section, not run (a real-width graph)
            cells.append(f"{mode} compiled{full or ' whole'}, not run")
        else:
            cells.append(f"{mode} {g['median_s'] * 1e3:.0f} ms, {e(g.get('max_rel_vs_torch'))}{full}")
    return "; ".join(cells)


def weights_table(doc: dict) -> str:
    """Each weights precision of the L=64 row graph side by side (scripts/bench/weights_bench.py)."""
    body = []
    for name, v in sorted(doc["variants"].items(), key=lambda nv: -nv[1]["bytes"]):
        vs = v.get("vs_fp32_graph")
        effect, cpu = v["quantization_effect"], v["cpu"]
        body.append(
            [
                f"`{name}`",
                f"{v['bytes']:,} ({doc['bytes_over_fp32'][name]:.3f}x)",
                f"{e(v['conversion']['max_rel_vs_torch'])} / {e(v['conversion']['max_rel_per_position_vs_torch'])}"
                + (
                    f"; its arithmetic {e(arith['max_rel_vs_torch'])} / {e(arith['max_rel_per_position_vs_torch'])}"
                    if (arith := v.get("cpu_arithmetic"))
                    else ""
                ),
                f"{e(vs['max_rel'])}" if vs else "-",
                f"{effect['min_top1_agreement']:.3f} / {effect['min_top5_agreement']:.3f} / {e(effect['max_mean_kl'])}",
                f"{cpu['litert_median_s'] * 1e3:.1f} ms ({doc['litert_speedup_over_fp32'][name]:.2f}x); "
                f"{cpu['fraction_of_peak']:.2f} of peak",
                gpu_cell(v.get("gpu")),
                decision_cell(v.get("decision")),
            ]
        )
    line = (
        f"From `make weights-bench` at {doc['measured_utc']} on `{doc['source']}`, row graph L={doc['L']}, "
        f"records {', '.join(f'{k} ({n} tokens)' for k, n in doc['records'].items())}; `results/weights.json`."
    )
    refs = doc.get("reference_records")
    if refs:
        line += (
            f" Every graph of the release on its reference record, {refs['workspace_weights']} file against its "
            f"{refs['converted_at']} twin: max rel {e(refs['max_rel'])} over {len(refs['rows'])} graphs."
        )
    header = [
        "weights",
        "bytes",
        "conversion error (CPU; global / per position; dynamic: and against the CPU's arithmetic)",
        "vs the fp32 graph",
        "vs unquantized: top-1 / top-5 agreement / mean KL",
        "LiteRT CPU",
        "GPU accelerator",
        "decision, CPU: mean KLD / same top / ln PPL ratio",
    ]
    floor = doc.get("decision_floor")
    if floor:
        line += (
            f" Decision figures over {doc['scored_tokens']:,} held-out tokens against stock float64; the floor "
            f"(stock transformers in torch float16): {decision_cell(floor)}."
        )
    return f"{line}\n\n{table(header, body)}"


def decision_cell(f: dict | None) -> str:
    """A place's mean KLD / same top / ln PPL ratio, or "-"."""
    if not f:
        return "-"
    return f"{e(f['kld_mean'])} / {percent(f['same_top'])} / {f['ln_ppl_ratio']:+.1e}"


def weights_summary_table(doc: dict) -> str:
    """Each `weights` as the pipeline stores it (weight_storage.pipeline_scheme), from the weights bench:
    size, conversion error, the CPU's decisions beside llama.cpp's at the same bits, CPU speed, the GPU."""
    from scripts.checks import llama_cpp
    from scripts.litert.weight_storage import pipeline_scheme
    from scripts.pipeline.params import WEIGHT_PRECISIONS

    body = []
    for w in WEIGHT_PRECISIONS:
        name, v = next(
            ((n, v) for n, v in doc["variants"].items() if v["weights"] == w and v["scheme"] == pipeline_scheme(w)),
            (None, None),
        )
        if v is None:
            continue
        exact = v.get("exact_form") or v["conversion"]
        gpu = v.get("gpu") or {}
        whole = bool(gpu) and all(g.get("compiled") and g.get("fully_accelerated") for g in gpu.values())
        gpu_fp32 = (gpu.get("fp32") or {}).get("max_rel_vs_torch")
        same = llama_cpp.SAME_BITS.get(w)
        theirs = llama_cpp.published(same) if same else None
        made = v.get("decision")
        beats = (
            "-"
            if theirs is None or not made
            else ("yes" if made["kld_mean"] <= theirs.kld_mean and made["same_top"] >= theirs.same_top else "no")
        )
        body.append(
            [
                f"`{w}`",
                f"{v['bytes']:,} ({doc['bytes_over_fp32'][name]:.3f}x)",
                f"{e(exact['max_rel_vs_torch'])} / {e(gpu_fp32) if gpu_fp32 is not None else '-'}",
                e(v["conversion"]["max_rel_vs_torch"]) if v.get("exact_form") else "-",
                decision_cell(made),
                f"`{same}` {e(theirs.kld_mean)} / {percent(theirs.same_top)}; better: {beats}" if theirs else "-",
                f"{doc['litert_speedup_over_fp32'][name]:.2f}x"
                + (
                    f"; litert-benchmark {bench['median_ms']:.2f} ms, "
                    f"torch eager {v['cpu']['torch_median_s'] * 1e3:.1f} ms"
                    if (bench := v.get("litert_benchmark"))
                    else ""
                ),
                ("every mode whole" if whole else gpu_cell(gpu)) if gpu else "not run",
            ]
        )
    line = (
        f"From `make weights-bench` at {doc['measured_utc']} on `{doc['source']}`, row graph L={doc['L']} "
        f"(`results/weights.json`; every variant and column in docs/release.md). llama.cpp: {llama_cpp.SOURCE}."
    )
    header = [
        "weights",
        "bytes (x fp32)",
        "conversion error: CPU (exact form) / GPU fp32",
        "CPU as stored (dynamic kernels) vs torch",
        "decision, CPU as stored: mean KLD / same top / ln PPL ratio",
        "llama.cpp at the same bits",
        "LiteRT CPU speed-up over fp32 (one run); medians",
        "GPU accelerator",
    ]
    return f"{line}\n\n{table(header, body)}"


def host_tables_table(doc: dict) -> str:
    """The host tables at each release.host_weights_precision (scripts/bench/weights_bench.py): bytes, and
    the decisions they alone give, beside llama.cpp's at the same bits."""
    from scripts.checks import llama_cpp

    held = doc.get("host_tables")
    if not held:
        return "Not measured: this weights bench predates the host tables' figures (or ran on random ids)."
    bf16 = held["bf16"]["bytes"]
    body = []
    for precision, t in sorted(held.items(), key=lambda kv: -kv[1]["bytes"]):
        same = llama_cpp.SAME_BITS.get(precision.split("b")[0])
        theirs = llama_cpp.published(same) if same else None
        body.append(
            [
                f"`{precision}`",
                f"{t['bytes']:,} ({t['bytes'] / bf16:.3f}x)",
                decision_cell(t["decision"]),
                f"`{same}` {e(theirs.kld_mean)} / {percent(theirs.same_top)}" if theirs else "-",
            ]
        )
    line = (
        f"From `make weights-bench` at {doc['measured_utc']} on `{doc['source']}`: embed_tokens and lm_head at each "
        f"precision, stock float64 over {doc['scored_tokens']:,} held-out tokens fed the embeddings they give and "
        "read through the lm_head they give, against the truth with the checkpoint's tables; `results/weights.json`."
    )
    header = ["host tables", "bytes (x bf16)", "decision: mean KLD / same top / ln PPL ratio", "llama.cpp, same bits"]
    return f"{line}\n\n{table(header, body)}"


# from results/weights.json (make weights-bench)
WEIGHTS_TABLES = {"weights": weights_table, "weights_summary": weights_summary_table, "host_tables": host_tables_table}


def read_trace(root: Path) -> dict:
    path = root / layout.result_path("quantization_trace")
    if not path.is_file():
        raise ClefError(f"no {path}: run `make quantization-trace` first")
    return json.loads(path.read_text())


def trace_table(doc: dict) -> str:
    """Each group of Linears quantized alone at each traced precision (scripts/bench/quantization_trace.py):
    mean KLD / same top, every Linear first, then each role over the layers, then each layer."""
    precisions = list(doc["precisions"])
    rows = [("every Linear", {w: doc["precisions"][w]["all_linears"] for w in precisions}, "all")]
    for kept, label in (("bf16", "every Linear but layer 0's (bf16)"), ("int8", "every Linear, layer 0's at int8")):
        found = {w: (doc["precisions"][w].get("first_layer_kept") or {}).get(kept) for w in precisions}
        if any(found.values()):
            rows.append((label, found, "all"))
    for kind in ("by_role", "by_layer"):
        first = doc["precisions"][precisions[0]][kind]
        for name in first:
            label = f"`{name}`" if kind == "by_role" else f"layer {name}"
            rows.append(
                (label, {w: doc["precisions"][w][kind][name]["decision"] for w in precisions}, first[name]["linears"])
            )
    body = [
        [label, str(n), *(f"{e(f[w]['kld_mean'])} / {percent(f[w]['same_top'])}" if f[w] else "-" for w in precisions)]
        for label, f, n in rows
    ]
    line = (
        f"From `make quantization-trace` at {doc['measured_utc']} on `{doc['source']}`: the torch row graph "
        f"L={doc['L']} over {doc['scored_tokens']:,} held-out tokens against stock float64, one group of Linears "
        "at the precision and the rest at the checkpoint's weights; `results/quantization_trace.json`."
    )
    header = ["Linears quantized", "how many", *(f"`{w}`: mean KLD / same top" for w in precisions)]
    return f"{line}\n\n{table(header, body)}"


TRACE_TABLES = {"quantization_trace": trace_table}  # from results/quantization_trace.json


def read_latency(root: Path) -> LatencyReport:
    path = root / layout.result_path("latency")
    if not path.is_file():
        raise ClefError(f"no {path}: run `dvc repro latency` first")
    return LatencyReport.read(path)


def latency_table(doc: LatencyReport) -> str:
    """Every signature's time from LiteRT's litert-benchmark (stages/latency.py): median and percentiles."""
    line = (
        f"`{doc.tool}` (ai-edge-litert {doc.ai_edge_litert}) on this machine's CPU accelerator, "
        f"{doc.threads} threads, {doc.runs} timed runs after {doc.warmup_runs} warm-up; "
        "`results/latency.json` from the `latency` stage of the same `dvc repro`, rendered by `make readme`."
    )
    body = [
        [
            label(r.graph, r.to_json()),
            f"`{r.signature}`",
            f"{r.median_ms:.3g}",
            f"{r.p5_ms:.3g} / {r.p95_ms:.3g}",
            f"{r.init_ms:.3g}",
            "yes" if r.fully_accelerated else "no",
        ]
        for r in doc.rows
    ]
    header = ["graph", "signature", "median ms", "p5 / p95 ms", "load ms", "every op on the accelerator"]
    return f"{line}\n\n{table(header, body)}"


LATENCY_TABLES = {"latency": latency_table}  # from results/latency.json (the latency stage)


def params_table(root: Path) -> str:
    """Which params.yaml keys rerun which stages, from `root`'s dvc.yaml (what each stage declares, or
    iterates over with foreach) and scripts/pipeline/bounds.py (the keys no stage declares)."""
    import yaml

    from scripts.pipeline import bounds

    raw = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    whole = [n for n, st in raw.items() if any(isinstance(p, dict) for p in st.get("do", st).get("params", []))]

    def rerun(key: str) -> tuple[str, ...]:
        section = key.split(".", 1)[0]
        found = []
        for name, st in raw.items():
            declared = [p for p in st.get("do", st).get("params", []) if isinstance(p, str)]
            over = st.get("foreach", "") == f"${{{section}}}"
            if over or section in declared or key in declared or any(d.startswith(key + ".") for d in declared):
                found.append(f"{name} (one per item)" if over else name)
        return tuple(found)

    body = []
    for section, value in params.items():
        keys = [f"{section}.{k}" for k in value] if isinstance(value, dict) else [section]
        groups: dict[tuple, list[str]] = {}
        for key in keys:
            groups.setdefault((rerun(key), bounds.is_bound(key)), []).append(key)
        for (stages, bound), members in groups.items():
            named = f"`{section}`" if members == keys else ", ".join(f"`{k}`" for k in members)
            why = (
                "a bound: decides pass or fail; check_params holds the records to it"
                if bound
                else "they compute with it"
            )
            body.append([named, ", ".join(stages) or f"only {' and '.join(whole)}", why])
    note = f"Any edit of params.yaml also reruns {' and '.join(whole)}, which read the whole file."
    return f"{note}\n\n{table(['params.yaml', 'reruns', 'why'], body)}"


GATES = ("check_params", "check_lengths")  # every stage waits for them: drawn once, not as 20 arrows


def dag_diagram(root: Path) -> str:
    """The pipeline as a Mermaid flowchart from `root`'s dvc.yaml: an arrow where a stage reads what
    another writes, left out where a longer path already leads there (a foreach stage is one node,
    `name@each`); the two params checks every stage waits for are named in a note, not drawn."""
    import yaml

    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]

    def paths(entries) -> list[str]:
        return [e if isinstance(e, str) else next(iter(e)) for e in entries or []]

    body = {name: st.get("do", st) for name, st in stages.items()}
    label = {name: f"{name}@each" if "foreach" in st else name for name, st in stages.items()}
    writes = {
        name: [re.sub(r"\$\{item[^}]*\}", "*", o) for o in paths(b.get("outs")) + paths(b.get("metrics"))]
        for name, b in body.items()
    }
    edges = {name: set() for name in stages if name not in GATES}
    for name in edges:
        reads = [d for d in paths(body[name].get("deps")) if not d.endswith(".py")]
        for source in edges:
            if source != name and any(_covers(o, d) or _covers(d, o) for o in writes[source] for d in reads):
                edges[source].add(name)

    def reachable(start: str, skip: str) -> set[str]:
        seen, todo = set(), [n for n in edges[start] if n != skip]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += edges[n]
        return seen

    lines = ["```mermaid", "flowchart LR"]
    for source in edges:
        for target in sorted(edges[source], key=list(stages).index):
            if target not in reachable(source, skip=target):  # the transitive reduction
                lines.append(f"  {source}[{label[source]}] --> {target}[{label[target]}]")
    note = f"Every stage also waits for {' and '.join(f'`{g}`' for g in GATES)} (params.yaml's schema, the lengths)."
    return "\n".join([*lines, "```"]) + f"\n\n{note}\n"


def _covers(out: str, dep: str) -> bool:
    """A dep path that is an output path, lies under it, or matches it with `*` for a foreach item."""
    import fnmatch

    return dep == out or dep.startswith(out.rstrip("/") + "/") or fnmatch.fnmatch(dep, out)


def llama_cpp_table(root: Path) -> str:
    """llama.cpp's published figures (scripts/checks/llama_cpp.py), the scale for the decision figures."""
    from scripts.checks import llama_cpp

    body = [
        [f"`{f.name}`", f"{f.kld_mean:.2e}", percent(f.same_top), "-" if f.ppl_ratio is None else f"{f.ppl_ratio:.4f}"]
        for f in llama_cpp.FIGURES
    ]
    return f"{llama_cpp.SOURCE}:\n\n" + table(["llama.cpp quantization", "mean KLD", "same top", "PPL ratio"], body)


DVC_TABLES = {"params": params_table, "dag": dag_diagram, "llama_cpp": llama_cpp_table}  # no run needed

TABLES = {
    "bundle": bundle_table,
    "checks": checks_table,
    "rows": rows_table,
    "export_bench": export_bench_table,
    "pairs": pairs_table,
    "gpu": gpu_table,
    "decisions": decisions_table,
    "decision_summary": decision_summary_table,
}


def positions_picture(manifest: Manifest) -> ForeignJson:
    """The positions chart of the release's graph entries (pictures.positions)."""
    return pictures.positions({name: entry.to_json() for name, entry in manifest.artifacts.items()})


PICTURES = {  # picture_NAME blocks: NAME -> (the chart, the records it draws)
    "errors": (pictures.errors, "rows"),
    "gpu_modes": (pictures.gpu_modes, "rows"),
    "sizes": (pictures.sizes, "weights"),
    "positions": (positions_picture, "manifest"),
}
PICTURE_SOURCES = {"rows": read_metrics, "weights": read_weights, "manifest": read_manifest}  # the readers
PICTURE_TITLES = {
    "errors": "LiteRT vs torch per graph",
    "gpu_modes": "GPU half modes over the float16 floor",
    "sizes": "size per weights precision",
    "positions": "error at each position of each graph's reference record",
}


def block_names() -> list[str]:
    """Every generated block there is: each appears once across README.md and docs/."""
    return [
        *TABLES,
        *BENCH_TABLES,
        *WEIGHTS_TABLES,
        *TRACE_TABLES,
        *LATENCY_TABLES,
        *DVC_TABLES,
        *(f"picture_{k}" for k in PICTURES),
    ]


def render(
    text: str, root: Path = Path("."), files: dict | None = None, document: Path = README
) -> tuple[str, list[str]]:
    """A document's text with every generated block rendered from `root`'s records -> (text, blocks
    changed). `files`, when given, receives {path: SVG text} of each picture it shows; `document`, its
    path, makes the pictures' links relative to it."""
    changed = []
    records: dict = {}  # read when a block needs them: the pipeline's metrics, the benchmark

    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name.startswith("picture_") and name.removeprefix("picture_") in PICTURES:
            key = name.removeprefix("picture_")
            chart, source = PICTURES[key]
            path = pictures.FOLDER / f"{key}.svg"
            if source not in records:
                records[source] = PICTURE_SOURCES[source](root)
            drawn = pictures.svg(chart(records[source]))
            if files is not None:
                files[path] = drawn
            if not (root / path).is_file() or (root / path).read_text() != drawn:
                changed.append(name)
            link = Path(os.path.relpath(path, document.parent)).as_posix()
            return m.group(1) + f"![{PICTURE_TITLES[key]}]({link})\n" + m.group(4)
        if name in BENCH_TABLES:
            if "bench" not in records:
                records["bench"] = read_bench(root)
            bench = records["bench"]
            body = f"{bench_line(bench)}\n\n{BENCH_TABLES[name](bench)}"
        elif name in WEIGHTS_TABLES:
            body = WEIGHTS_TABLES[name](read_weights(root))
        elif name in TRACE_TABLES:
            body = TRACE_TABLES[name](read_trace(root))
        elif name in LATENCY_TABLES:
            body = LATENCY_TABLES[name](read_latency(root))
        elif name in DVC_TABLES:
            body = DVC_TABLES[name](root)
        elif name in TABLES:
            if "rows" not in records:
                records["rows"] = read_metrics(root)
            if "manifest" not in records:
                records["manifest"] = read_manifest(root)
            if "run" not in records:
                records["run"] = run_line(records["manifest"])
            body = f"{records['run']}\n\n{TABLES[name](records['rows'])}"
        else:
            raise ClefError(f"{document}: block `{name}` has no table; known: {', '.join(block_names())}")
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text), changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report the tables that differ")
    a = ap.parse_args()
    if not README.is_file():
        raise ClefError(f"no {README} here: run it from the repository's top directory (make readme)")
    files: dict[Path, str] = {}
    rendered = {doc: render(doc.read_text(), files=files, document=doc) for doc in documents()}
    changed = [f"{doc}: {name}" for doc, (_, names) in rendered.items() for name in names]
    if a.check:
        if changed:
            raise ClefError(f"generated tables differ from results/: {', '.join(changed)} (make readme rewrites them)")
        return
    for path, drawn in files.items():
        atomic.write_text(path, drawn)
    for doc, (text, _) in rendered.items():
        atomic.write_text(doc, text)
    print(
        f"{len(rendered)} documents: {len(changed)} generated tables rewritten"
        + (f" ({', '.join(changed)})" if changed else "")
    )


if __name__ == "__main__":
    run_command(main)  # not a DVC stage: no results/runtime/ record
