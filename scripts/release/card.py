"""The release's model card (its README.md): what each file is, the contracts, how to run it, and the
verification figures. Only run-independent figures go in (errors, thresholds, sizes, op counts; no
times), so the card, like every other file the manifest hashes, is the same on a rebuild."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scripts.checkpoint.snapshot import SnapshotRecord
from scripts.pipeline.errors import ClefError
from scripts.pipeline.params import parse_weights

if TYPE_CHECKING:
    from scripts.pipeline.mappings import ForeignJson


def gpu_precision_advice(gpus: list[dict]) -> list[str]:
    """How a device team selects each GPU mode through LiteRT's C/C++ API, and what each gave here."""
    from scripts.litert.litert_c import PRECISION, PRECISION_NAMES

    def worst(mode: str, key: str):
        vals = [
            g["modes"][mode][key]
            for g in gpus
            if mode in (g.get("modes") or {}) and g["modes"][mode].get(key) is not None
        ]
        return max(vals) if vals else None

    out = [
        "Choosing the GPU precision (LiteRT >= 2.2): `LrtSetGpuAcceleratorCompilationOptionsPrecision` in the "
        "C API, `GpuOptions::SetPrecision` in C++ (`GpuOptions::Precision::kFp16WithFp32Accum` for mixed), or "
        "the opaque options entry `gpu_options` with the TOML text `precision = <value>`, which is what "
        "clef-litert sets; the value is a `LiteRtDelegatePrecision`. What each mode gave on these graphs:",
        "",
    ]
    for mode, value in PRECISION.items():
        if mode == "fp32":
            err = worst(mode, "max_rel_vs_torch")
            figure = (
                f"worst {err:.2e} vs the torch graph (exact up to float32 rounding)"
                if err is not None
                else "not measured"
            )
        else:
            err, over = worst(mode, "max_rel_vs_f64"), worst(mode, "over_floor")
            figure = (
                f"worst {err:.2e} vs float64, {over:.1f} x the torch-float16 floor"
                if err is not None
                else "not measured"
            )
        out.append(f"- {mode}: `{PRECISION_NAMES[mode]}` ({value}): {figure}.")
    out += [
        "",
        "mixed (fp16 storage, fp32 accumulation in FULLY_CONNECTED and BATCH_MATMUL) removes fp16's accumulation "
        "loss, which grows with the width; each mode's ratio to the floor is the one recorded above, and the table "
        "says which modes the release's checks held to the target; a "
        "runtime older than LiteRT 2.2 lacks mixed, and one that cannot parse the option runs fp16 silently, so "
        "check a mode by its effect (`clef run --gpu --precision mixed` runs a probe graph first).",
    ]
    return out


PLACE_NAMES = {"cpu": "LiteRT CPU", "gpu_fp32": "GPU fp32", "gpu_fp16": "GPU fp16", "gpu_mixed": "GPU mixed"}


def decision_lines(graphs: list[dict]) -> list[str]:
    """What the head decides from each graph's hidden states, per GPU mode (verify_gpu's decision record),
    beside the torch-float16 floor and llama.cpp's figures, and the GPU mode the figures point a device
    team to. [] when the run has no decision figures (random weights)."""
    from scripts.checks import llama_cpp

    body, mixed_ok, mixed_seen = [], True, False
    for a in graphs:
        what = f"row L={a['L']}" if a["kind"] == "row" else f"pair P={a['P']} S={a['S']}"
        made = (a.get("gpu") or {}).get("decision") or {}
        places = made.get("places", {})
        order = [*PLACE_NAMES, "torch_float16"]
        for place, f in sorted(places.items(), key=lambda pf: order.index(pf[0]) if pf[0] in order else len(order)):
            bound = (made.get("bounds") or {}).get(place)
            if place == "gpu_mixed":
                mixed_seen = True
                mixed_ok &= (
                    bool(bound) and f["kld_mean"] <= bound["max_kld_mean"] and f["same_top"] >= bound["min_same_top"]
                )
            body.append(
                f"| {what} | {PLACE_NAMES.get(place, 'floor: stock transformers in torch float16')} | "
                f"{f['kld_mean']:.2e} | {100 * f['same_top']:.2f} % | {f['ln_ppl_ratio']:+.1e} |"
            )
    if not body:
        return []
    out = [
        "## What the head decides",
        "",
        "Per graph and GPU mode, against stock transformers in float64 with the lm_head in float64, over "
        "held-out text the checkpoint never trained on (llama.cpp's `--kl-divergence` statistics, in full with "
        "their error bars in manifest.json's `gpu` entries; LiteRT's CPU interpreter at these weights is "
        "held to its own bound, params.yaml `decision`, by the release's checks):",
        "",
        "| graph | place | mean KLD | same top | ln PPL ratio |",
        "|---|---|---|---|---|",
        *body,
        "",
        f"For scale, {llama_cpp.SOURCE}: "
        + "; ".join(f"{f.name} mean KLD {f.kld_mean:g}, same top {100 * f.same_top:.2f} %" for f in llama_cpp.FIGURES)
        + ".",
        "",
    ]
    if mixed_seen:
        out += [
            "Which GPU mode to set: "
            + (
                "mixed (fp16 storage, fp32 accumulation): its decisions stay within the bound the release "
                "holds it to on every graph above; fp32 where a device's runtime lacks mixed (LiteRT < 2.2) "
                "or agreement with the CPU to float32 rounding is wanted."
                if mixed_ok
                else "fp32 (enforce_f32): mixed misses the decision bound on at least one graph above; "
                "fp16 and mixed are recorded, not recommended."
            ),
            "",
        ]
    return out


def _io_table(entries: list[dict]) -> list[str]:
    lines = ["| name | shape | dtype | meaning |", "|---|---|---|---|"]
    lines += [f"| `{e['name']}` | {e['shape']} | {e['dtype']} | {e.get('meaning') or ''} |" for e in entries]
    return lines


def signing_lines(signed: dict) -> list[str]:
    if not signed["signed"]:
        return [
            "## Signature",
            "",
            f"**Unsigned** ({signed['why']}). `clef verify` checks every file against `manifest.json`, "
            "which proves the files are the ones the manifest lists, not who made the manifest: a graph "
            "edited together with its manifest entry passes. Obtain this release from a source you trust.",
            "",
        ]
    return [
        "## Signature",
        "",
        f"Signed with {signed['tool']} (OpenSSF): `{signed['signature']}` is a Sigstore bundle over "
        f"{signed['covers']}, by the elliptic-curve key `{signed['key_fingerprint']}` (sha256 of its "
        "public key's DER). Check it with the public key your team keeps:",
        "",
        "```",
        "clef verify . --key release.pub --require-signature",
        "```",
        "",
    ]


def own_file(artifact: dict, bundle: dict | None) -> str:
    """The bytes and sha256 cells of a graph's row: its own file's, or empty (the bundle's row has them)."""
    return " | " if bundle else f"{artifact['bytes']} | `{artifact['sha256'][:16]}`"


# What the card says of each params.yaml `weights` (scripts/layers/weight_precision.py).
WEIGHTS_SAID = {
    "fp32": "Weights and arithmetic fp32",
    "fp16": "Linear weights stored as fp16 (the checkpoint's bf16 values), arithmetic fp32",
    "int8": "Linear weights stored as int8, one scale per output channel, read by the FULLY_CONNECTEDs "
    "themselves (on the CPU, XNNPACK's dynamic kernels also quantize each input row to int8)",
    "int4": "Linear weights stored as int4, one scale per output channel or, where the weights name a block "
    "(int4b32), a float16 scale per block of a row, read by the FULLY_CONNECTEDs themselves (on the CPU, "
    "XNNPACK's dynamic kernels also quantize each input row to int8)",
}


def weights_said(weights: str) -> str:
    """The card's sentence for params.yaml `weights` (a spelling: int4b32 is said as int4)."""
    return WEIGHTS_SAID[parse_weights(weights).precision]


# ---- what the checkpoint's own card states -----------------------------------------------------------

# The keys of the checkpoint's front matter the release's card carries: the terms the weights come under.
CARRIED = ("license", "license_name", "license_link")


def checkpoint_card(snapshot: Path) -> ForeignJson:
    """The front matter of the checkpoint's own model card (the snapshot's README.md, as the hub keeps it);
    {} when the snapshot has no card or the card none. Front matter that is not YAML is refused, naming
    the file: a license silently dropped would be worse than a release not built."""
    import yaml

    path = Path(snapshot) / "README.md"
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n") or "\n---" not in text[3:]:
        return {}
    try:
        meta = yaml.safe_load(text[4 : text.index("\n---", 3)])
    except yaml.YAMLError as exc:
        raise ClefError(f"{path}: its front matter is not YAML ({' '.join(str(exc).split())[:160]})") from None
    return meta if isinstance(meta, dict) else {}


def front_matter(repo: str, theirs: dict) -> list[str]:
    """The card's Hugging Face metadata: the checkpoint as its base model, its license carried over."""
    import yaml

    meta = {
        "base_model": repo,
        **{k: theirs[k] for k in CARRIED if k in theirs},
        "library_name": "litert",
        "tags": ["litert", "tflite", "gated-deltanet", "qwen3.5"],
    }
    return ["---", *yaml.safe_dump(meta, sort_keys=False).splitlines(), "---", ""]


def license_lines(repo: str, theirs: dict) -> list[str]:
    """What the card says of the terms and the lineage, as the checkpoint's own card states them."""
    if not theirs:
        return [
            f"The snapshot of `{repo}` carries no model card (README.md) with front matter: its license and "
            "base model are not stated here; the checkpoint's own page states them.",
            "",
        ]
    license = theirs.get("license", "not stated")
    named = f" ({theirs['license_name']})" if theirs.get("license_name") else ""
    base = theirs.get("base_model")
    base = ", ".join(base) if isinstance(base, list) else base
    lineage = f"; its card names `{base}` as its base model" if base else ""
    return [f"License: `{license}`{named}, as `{repo}`'s own model card states it{lineage}.", ""]


def render(
    name: str,
    rec: SnapshotRecord,
    form: str,
    weights: str,
    host: dict,
    artifacts: dict,
    overall: dict,
    signed: dict,
    bundle: dict | None,
    theirs: dict,
    pictures: dict[str, str],
) -> str:
    """The card; `theirs`: the checkpoint's own card's front matter (checkpoint_card); `pictures`:
    {path in the release: title} of the SVGs it shows."""
    rows = sorted((a for a in artifacts.values() if a["kind"] == "row"), key=lambda a: a["L"])
    pairs = sorted((a for a in artifacts.values() if a["kind"] == "pair"), key=lambda a: (a["P"], a["S"]))
    out = [
        *front_matter(rec.repo, theirs),
        f"# {name}",
        "",
        f"LiteRT graphs of the text stack of `{rec.repo}` at revision `{rec.revision}` "
        f"(source: {rec.source}), GatedDeltaNet kernel form `{form}`. {weights_said(weights)}; the "
        "embedding lookup, the M-RoPE tables and the lm_head run on the host.",
        "",
        *license_lines(rec.repo, theirs),
        "## Files",
        "",
        "| file | what it is | bytes | sha256 (first 16) |",
        "|---|---|---|---|",
    ]
    if bundle is not None:
        share = bundle["sharing"]
        out.append(
            f"| `{bundle['file']}` | every graph below as signatures of one model over one copy of the weights "
            f"({len(bundle['signatures'])} signatures; constants {share['constant_bytes']} bytes, "
            f"{share['part_constant_bytes']} as separate graphs) | {bundle['bytes']} | `{bundle['sha256'][:16]}` |"
        )
    for a in rows:
        where = f"signature `{a['signature_names']['serving_default']}` of the bundle" if bundle else "its own file"
        out.append(
            f"| `{a['file']}` | row graph, L={a['L']}: final-norm hidden states of every position ({where}) | "
            f"{own_file(a, bundle)} |"
        )
    for a in pairs:
        names = a["signature_names"]
        where = (
            f"signatures `{names['prefix']}`, `{names['suffix']}` of the bundle" if bundle else "`prefix` and `suffix`"
        )
        out.append(
            f"| `{a['file']}` | shared-state pair, P={a['P']}, S={a['S']}: {where} over one copy of the weights | "
            f"{own_file(a, bundle)} |"
        )
    if host["weights"] == "include":
        held = host.get("precision") or "bf16"
        scaled = "" if held == "bf16" else ", codes and scales"
        host_weights = f"embed_tokens and lm_head ({held}{scaled}) in `host/model.safetensors`"
    else:
        host_weights = "embed_tokens and lm_head are referenced by hash, not included"
    out += [
        f"| `host/` | config and tokenizer; {host_weights} | | |",
        "| `checks/` | one reference record per graph: its inputs and the torch output it must match | | |",
        "| `manifest.json` | hashes of every file, provenance, signatures, verification figures | | |",
    ]
    if signed["signed"]:
        out.append(f"| `{signed['signature']}` | the signature over every other file (below) | | |")
    out += ["", *signing_lines(signed)]
    if rows:
        out += [f"## Row graph contract (L={rows[0]['L']} shown; other L change only the length)", ""]
        sig = rows[0]["signatures"]["serving_default"]
        out += ["Inputs:", ""] + _io_table(sig["inputs"]) + ["", "Outputs:", ""] + _io_table(sig["outputs"]) + [""]
        for key in ("attention_mask", "pad_guard", "state_io"):
            if key in rows[0]["contract"]:
                out.append(f"- {key.replace('_', ' ')}: {rows[0]['contract'][key]}")
        out.append("")
    if pairs:
        c = pairs[0]["contract"]
        out += [
            "## Pair contract",
            "",
            f"- rule: {c.get('rule')}",
            f"- the recurrent state is {c.get('recurrent_state_scale')} x transformers' (form `{form}`): a state "
            "is only valid for graphs of the same form",
            "- `prefix` takes the tokens of the shared context (right-padded to P) and returns hidden states and "
            "the state; `suffix` takes a question (right-padded to S), positions continuing at the prefix's real "
            "length, and that state. One prefix state serves any number of suffixes.",
            "",
        ]
        for sig_name, sig in pairs[0]["signatures"].items():
            out += [f"`{sig_name}` (P={pairs[0]['P']}, S={pairs[0]['S']}) inputs:", ""] + _io_table(sig["inputs"])
            out += ["", f"`{sig_name}` outputs:", ""] + _io_table(sig["outputs"]) + [""]
    out += [
        "## How to run",
        "",
        "```",
        "clef verify .                      # every hash, every signature on its reference record",
        'clef run --release . --text "..."  # smallest row graph that fits; top lm_head tokens',
        'clef run --release . --pair --text "shared context" --question "q1" --question "q2"',
        "clef audit <file>.tflite           # what produced a graph (a bundle: each of its graphs), from its metadata",
        "```",
        "",
        "Without clef: tokenize with `host/tokenizer.json`, take the bf16 `embed_tokens` rows as fp32, build the "
        "cos/sin tables for positions (i, i, i) with the config's M-RoPE settings, right-pad to L with zero "
        "rows and `valid` 0, run the row graph's signature (`row_L<L>` in the bundle, `serving_default` in a "
        "graph's own file), and multiply the hidden state of the last "
        "real position by `lm_head`.",
        "",
        "## Verification",
        "",
        "Errors (scripts/checks/compare.py): global, max |diff| / max |ref|; and the worst position's "
        "||diff|| / ||ref||.",
        "",
        "| check | max rel error | worst position | thresholds |",
        "|---|---|---|---|",
    ]

    def line(label, glob, position, bound, position_bound):
        shown = "-" if position is None else f"{position:.2e}"
        bounds = f"{bound:g}" if position_bound is None else f"{bound:g}, {position_bound:g}"
        out.append(f"| {label} | {glob:.2e} | {shown} | {bounds} |")

    labels = {
        "kernel": "kernel vs float64 recurrence",
        "layers": "GatedDeltaNet layers vs stock (float64)",
        "model": "row graph (torch) vs stock model (float64)",
    }
    for key, label in labels.items():
        m = overall.get(key, {})
        if "max_rel" in m:
            line(label, m["max_rel"], m.get("max_rel_per_position"), m["threshold"], m.get("threshold_per_position"))
    for a in rows + pairs:
        check = next(iter(a["verification"].values()))
        what = f"row L={a['L']}" if a["kind"] == "row" else f"pair P={a['P']} S={a['S']} (chaining vs row)"
        line(
            f"{what}: LiteRT vs torch",
            check["max_rel"],
            check.get("max_rel_per_position"),
            check["threshold"],
            check.get("threshold_per_position"),
        )
        ref = a["reference"]
        line(
            f"{what}: reference record in this package",
            ref["max_rel"],
            ref.get("max_rel_per_position"),
            ref["threshold"],
            ref.get("threshold_per_position"),
        )
        if "gpu" in a and "refused" in a["gpu"]:
            out.append(f"| {what}: GPU accelerator | refused: {a['gpu']['refused']} | | |")
        elif "gpu" in a:
            g = a["gpu"]
            line(
                f"{what}: GPU accelerator, fp32 (enforce_f32) vs torch",
                g["fp32_max_rel_vs_torch"],
                g.get("fp32_max_rel_per_position_vs_torch"),
                g["threshold_fp32"],
                g.get("threshold_per_position_fp32"),
            )
            for mode, m in (g.get("modes") or {}).items():
                if m.get("max_rel_vs_f64") is None:
                    continue
                held = "enforced" if m["enforced"] else "recorded"
                out.append(
                    f"| {what}: GPU accelerator, {mode} vs float64 (floor: torch float16 "
                    f"{m['floor_max_rel_vs_f64']:.2e}) | {m['max_rel_vs_f64']:.2e} | "
                    f"{m['max_rel_per_position_vs_f64']:.2e} | {m['target_over_floor']:g} x floor ({held}): "
                    f"{'met' if m['within_target'] else 'not met'} ({m['over_floor']:.1f} x, "
                    f"{m['over_floor_per_position']:.1f} x per position) |"
                )
    gpus = [a["gpu"] for a in artifacts.values() if "gpu" in a and "refused" not in a["gpu"]]
    if gpus:
        checked, layers = gpus[0]["layers_checked"], gpus[0]["layers"]
        out += [
            "",
            f"GPU accelerator: every signature of {sum(g['fully_accelerated'] for g in gpus)} of {len(gpus)} "
            f"graphs compiled for LiteRT's GPU accelerator alone (no CPU fallback) on "
            f"{gpus[0]['device']['selected'] or gpus[0]['device']['adapter']}, "
            + (
                f"all {layers} decoder layers."
                if checked == layers
                else f"over the first {checked} of {layers} decoder layers (the first block: every op kind of "
                "the graph), against the residual stream after them."
            ),
            "",
            *gpu_precision_advice(gpus),
        ]
    out += ["", *decision_lines(rows + pairs)]
    out += [
        "",
        "Ops per GatedDeltaNet layer in the graphs: "
        + ", ".join(
            f"{max(a['census']['ops_per_gdn_layer'].values())} (L={a['L']})"
            for a in rows
            if a["census"]["ops_per_gdn_layer"]
        )
        + f"; max tensor rank {max((a['census']['max_rank'] for a in artifacts.values()), default=0)}.",
        "",
    ]
    for path, title in pictures.items():
        out += [f"![{title}]({path})", ""]
    return "\n".join(out)
