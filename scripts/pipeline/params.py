"""params.yaml: one schema, checked before any stage removes an output.

Every rule about a parameter lives here (SCHEMA): its type, its range, the keys a section may hold
(an unknown key is refused with the nearest known one), and the forms the exporter can lower. The
`check_params` stage runs the whole schema before any other stage (every stage depends on its
output, which valid params never change), `check_lengths` holds the graph lengths to the snapshot's
context, and each stage still reads its own sections through `load`, so a stage run by hand checks
what it reads. No torch here: the check costs a fraction of a second.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path

from scripts.checks import records
from scripts.layers import kernel_form
from scripts.pipeline.errors import ClefError
from scripts.pipeline.mappings import ForeignJson

SOURCES = ("tiny", "synthetic", "hub")
GPU_DEPTHS = ("auto", "block", "all")
GPU_HALF_MODES = ("fp16", "mixed")  # the GPU modes held against float64 and the torch float16 floor


def gpu_depth(layers: str, source: str) -> str:
    """verify_gpu.layers as it applies to model.source: `auto` is `all` on the tiny checkpoint (its whole
    graphs take seconds on a software GPU) and `block` on any other (a 9B stack takes hours there)."""
    if layers == "auto":
        return "all" if source == "tiny" else "block"
    return layers


HOST_WEIGHT_MODES = ("include", "reference")
RELEASE_LAYOUTS = ("bundle", "files")  # one .tflite with every signature, or a .tflite per graph
# How a graph stores its Linear weights (scripts/layers/weight_precision.py): float32, float16, int8 per
# output channel, int4 per output channel or in blocks of INT4_BLOCKS along the input (`int4b32`).
WEIGHT_PRECISIONS = ("fp32", "fp16", "int8", "int4")
INT4_BLOCKS = (32, 64, 128, 256)
_WEIGHTS = re.compile(r"([a-z]+[0-9]+)(?:b([0-9]+))?")
# Where a graph's decision figures are measured (scripts/checks/decision_check.py): the LiteRT CPU
# interpreter at the release's weights, and each mode of the GPU accelerator.
DECISION_PLACES = ("cpu", "gpu_fp32", "gpu_fp16", "gpu_mixed")
REVISION = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")

Limits = dict[str, float]
"""A check's bounds: the params.yaml key, or the row figure it bounds (scripts/checks/compare.py) -> the
positive number it holds; which keys, the check names."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------
# value checkers: (value, name) -> value, or a ClefError naming params.yaml's key


def positive_number(value, name: str) -> float:
    """A threshold or factor: a finite number > 0 (a string such as `"1e-5x"` or `.nan` refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ClefError(f"params.yaml: {name} {value!r} is not a positive number")
    return float(value)


def factor(value, name: str) -> float:
    """A ratio to a figure measured before: a finite number >= 1 (below 1, the same run would fail it)."""
    if positive_number(value, name) < 1:
        raise ClefError(f"params.yaml: {name} {value!r} is below 1")
    return float(value)


def non_negative_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ClefError(f"params.yaml: {name} {value!r} is not a number >= 0")
    return float(value)


def fraction(value, name: str) -> float:
    """A share: a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ClefError(f"params.yaml: {name} {value!r} is not a fraction in (0, 1]")
    return float(value)


def count(value, name: str) -> int:
    """A number of repeats, heads, layers: an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise ClefError(f"params.yaml: {name} {value!r} is not an integer >= 1")
    return value


def one_of(*choices: str):
    def check(value, name: str) -> str:
        if value not in choices:
            raise ClefError(f"params.yaml: {name} {value!r} is not one of {', '.join(choices)}")
        return value

    return check


def subset_of(*choices: str):
    """A list of distinct values, each one of `choices` (possibly empty)."""

    def check(value, name: str) -> list:
        if not isinstance(value, list) or len(set(map(str, value))) != len(value):
            raise ClefError(f"params.yaml: {name} {value!r} is not a list of distinct values of {', '.join(choices)}")
        for v in value:
            one_of(*choices)(v, f"{name} entry")
        return value

    return check


def pattern(regex: re.Pattern, what: str):
    def check(value, name: str) -> str:
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise ClefError(f"params.yaml: {name} {value!r} is not {what}")
        return value

    return check


@dataclass(frozen=True)
class Weights:
    """params.yaml `weights` read: the precision, and int4's block along the input dimension (None: one
    scale per output row). Spelt `int4b32`; str() gives the spelling back."""

    precision: str
    block: int | None = None

    def __str__(self) -> str:
        return self.precision + (f"b{self.block}" if self.block else "")


def parse_weights(text) -> Weights:
    """A `weights` spelling -> Weights, or a ClefError naming what is wrong. Blockwise int8 is refused:
    LiteRT's GPU accelerator aborts the process on a blockwise int8 FULLY_CONNECTED weight (ML Drift's
    builder ends in ABSL_LOG(FATAL)), and per-row int8 is what every runtime reads."""
    m = _WEIGHTS.fullmatch(text) if isinstance(text, str) else None
    if m is None or m.group(1) not in WEIGHT_PRECISIONS:
        raise ClefError(
            f"weights {text!r} is not one of {', '.join(WEIGHT_PRECISIONS)} (int4 may take a block: int4b32)"
        )
    precision, block = m.group(1), m.group(2) and int(m.group(2))
    if block is not None and precision == "int8":
        raise ClefError(
            f"weights {text}: blockwise int8 is refused (LiteRT's GPU accelerator aborts the process on it); "
            "int8 is per output channel"
        )
    if block is not None and precision != "int4":
        raise ClefError(f"weights {text}: a block applies to int4 only")
    if block is not None and block not in INT4_BLOCKS:
        raise ClefError(f"weights {text}: block {block} is not one of {', '.join(map(str, INT4_BLOCKS))}")
    return Weights(precision, block)


HOST_BF16 = "bf16"  # the host tables as the checkpoint holds them


def host_precision(value, name: str = "release.host_weights_precision") -> str:
    """The precision a release stores the host tables (embed_tokens, lm_head) at: bf16, or an integer
    `weights` spelling (int8, int4, int4b32 ...), stored with the graphs' formulas (scripts/qwen35/host_tables.py)."""
    if value == HOST_BF16:
        return value
    try:
        spec = parse_weights(value)
    except ClefError as exc:
        raise ClefError(f"params.yaml: {name}: {exc}, or bf16") from None
    if spec.precision not in ("int8", "int4"):
        raise ClefError(
            f"params.yaml: {name} {value!r}: the host tables are bf16, int8 or int4 (the checkpoint holds them in bf16)"
        )
    return str(spec)


def block_unfit(weights: str, tensor: str, inputs: int) -> str | None:
    """Why a Linear weight with `inputs` inputs cannot be stored at `weights` in blocks, or None."""
    spec = parse_weights(weights)
    if spec.block and inputs % spec.block:
        return f"weights {spec}: {tensor} has {inputs} inputs, not a multiple of the block {spec.block}"
    return None


def weights_text(value, name: str) -> str:
    try:
        parse_weights(value)
    except ClefError as exc:
        raise ClefError(f"params.yaml: {name}: {exc}") from None
    return value


def pipeline_weights(value, name: str) -> str:
    """The weights the pipeline's graphs are stored at: a spelling, and not blockwise. Blockwise int4 aborts
    LiteRT's GPU accelerator (gpu_accelerator.BLOCKWISE_ABORTS_IN), and the CPU checks' exact form of a
    graph reads each integer weight through a DEQUANTIZE, which has no blockwise form."""
    if parse_weights(weights_text(value, name)).block:
        raise ClefError(
            f"params.yaml: {name} {value}: blockwise int4 aborts LiteRT's GPU accelerator and has no exact form "
            "for the CPU checks (a DEQUANTIZE reads no blockwise weight); make weights-bench measures it"
        )
    return value


def weights_list(value, name: str) -> list[str]:
    if not isinstance(value, list) or len(set(map(str, value))) != len(value):
        raise ClefError(f"params.yaml: {name} {value!r} is not a list of distinct weights")
    return [weights_text(v, f"{name} entry") for v in value]


def kernel_form_text(value, name: str) -> str:
    """A form the grammar reads, in its canonical spelling (scripts/layers/kernel_form.py); recorded forms may
    be ones the exporter refuses."""
    try:
        kernel_form.parse_canonical(value)
    except ClefError as exc:
        raise ClefError(f"params.yaml: {name}: {exc}") from None
    return value


def exportable_form(value, name: str) -> str:
    """The form the graphs are built with: one the grammar reads, canonically spelt, and the exporter can lower."""
    try:
        kernel_form.check_exportable(kernel_form.parse_canonical(value))
    except ClefError as exc:  # the message names the form already
        raise ClefError(f"params.yaml: {exc}") from None
    return value


def form_list(value, name: str) -> list[str]:
    """Forms recorded beside the configured one (an empty list records that one alone)."""
    if not isinstance(value, list):
        raise ClefError(f"params.yaml: {name} must be a list of kernel forms")
    return [kernel_form_text(v, name) for v in value]


def lengths_list(value, name: str) -> list[int]:
    """Sequence lengths: a non-empty list of positive integers, each once."""
    if not isinstance(value, list) or not value:
        raise ClefError(f"params.yaml: {name} must be a non-empty list of positive integers")
    for n in value:
        if not _is_int(n) or n <= 0:
            raise ClefError(f"params.yaml: {name}: length {n!r} is not a positive integer")
    if len(set(value)) != len(value):
        raise ClefError(f"params.yaml: {name} {value} repeat a value")
    return value


def graph_lengths(value, name: str) -> list[int]:
    """The row graph lengths: lengths_list, each long enough for every record the checks build
    (scripts/checks/records.py), which verify_model would otherwise refuse after removing its outputs."""
    for n in lengths_list(value, name):
        if problem := records.row_unfit(n):
            least = next(m for m in range(n, 1 << 16) if records.row_unfit(m) is None)
            raise ClefError(f"params.yaml: {name}: length {n} is too short for the checks: {problem} (L >= {least})")
    return value


def pairs_list(value, name: str) -> list[dict]:
    """The shared-state pairs: a non-empty list of {prefix, suffix}, positive integers, each pair once (as
    `lengths` holds a row graph at least: the release promises both kinds)."""
    if not isinstance(value, list) or not value:
        raise ClefError(f"params.yaml: `{name}` must be a non-empty list of {{prefix: P, suffix: S}}")
    seen = set()
    for q in value:
        if not isinstance(q, dict) or set(q) != {"prefix", "suffix"}:
            raise ClefError(f"params.yaml: pair {q!r} must be a mapping with exactly prefix and suffix")
        for key in ("prefix", "suffix"):
            if not _is_int(q[key]) or q[key] <= 0:
                raise ClefError(f"params.yaml: pair {q!r}: {key} is not a positive integer")
        if problem := records.pair_unfit(q["prefix"], q["suffix"]):
            raise ClefError(f"params.yaml: pair {q!r} is too short for the checks: {problem} does not fit")
        if (q["prefix"], q["suffix"]) in seen:
            raise ClefError(f"params.yaml: pair {q!r} is listed twice")
        seen.add((q["prefix"], q["suffix"]))
    return value


def mapping(required: dict, optional: dict | None = None):
    """A section that is a mapping: every `required` key present, nothing outside required + optional."""
    optional = optional or {}

    def check(value, name: str) -> ForeignJson:
        known = {**required, **optional}
        if not isinstance(value, dict):
            raise ClefError(f"params.yaml: `{name}` must be a mapping with {', '.join(required)}")
        for key in value:
            if key not in known:
                raise ClefError(f"params.yaml: unknown key {name}.{key}{did_you_mean(key, known)}")
        for key, rule in known.items():
            if key in value:
                rule(value[key], f"{name}.{key}")
            elif key in required:
                raise ClefError(f"params.yaml: {name}.{key} is missing")
        return value

    return check


def optional_path(value, name: str) -> str | None:
    """null, or a non-empty path string (what lies there is checked by the stage that reads it)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ClefError(f"params.yaml: {name} {value!r} must be a file path or null")
    return value


def did_you_mean(key, known) -> str:
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
    return f"; did you mean {close[0]}?" if close else f"; known keys: {', '.join(known)}"


def check_model_section(value, name: str) -> ForeignJson:
    rules = mapping(
        {
            "source": one_of(*SOURCES),
            "repo": pattern(REPO, "an <org>/<name> repository id"),
            "revision": pattern(
                REVISION,
                "a full 40-hex commit id; branch and tag names move, so a release pinned to one cannot be audited",
            ),
        },
        {"synthetic_layers": count},
    )
    rules(value, name)
    if value["source"] == "synthetic" and "synthetic_layers" not in value:
        raise ClefError(
            f"params.yaml: {name}.synthetic_layers is missing (the real-width synthetic checkpoint's layer count)"
        )
    return value


THRESHOLD = positive_number

# The whole of params.yaml: section -> rule. The comments in params.yaml say what each value means.
SCHEMA = {
    "model": check_model_section,
    "stack": mapping({"rss_factor": positive_number, "rss_overhead_gib": non_negative_number}),
    "memory": mapping({"factor": positive_number, "overhead_gib": non_negative_number}),
    "form": exportable_form,
    "controls": mapping({"min_over_threshold": positive_number}),
    "verify_kernel": mapping(
        {"forms": form_list, "max_rel_vs_f64": THRESHOLD, "max_rel_per_position_vs_f64": THRESHOLD}
    ),
    "kernel_bench": mapping({"heads": count, "head_dim": count, "lengths": lengths_list, "repeats": count}),
    "lengths": graph_lengths,
    "export_bench": mapping({"latency_repeats": count, "target_ops_per_gdn_layer_at_L64": count}),
    "verify_layers": mapping({"max_rel_vs_stock_f64": THRESHOLD, "max_rel_per_position_vs_stock_f64": THRESHOLD}),
    "verify_model": mapping(
        {
            "max_rel_vs_stock_f64": THRESHOLD,
            "max_rel_per_position_vs_stock_f64": THRESHOLD,
            "max_rel_causality": THRESHOLD,
        }
    ),
    "latency": mapping({"runs": count, "warmup_runs": count, "threads": count}),
    "verify_tflite": mapping(
        {
            "max_rel_vs_torch": THRESHOLD,
            "max_rel_per_position_vs_torch": THRESHOLD,
            "max_rel_dynamic_kernels": THRESHOLD,
            "max_rel_per_position_dynamic_kernels": THRESHOLD,
            "latency_repeats": count,
            "latency_seconds": positive_number,
        }
    ),
    "pairs": pairs_list,
    "verify_pair": mapping(
        {
            "max_rel_vs_row": THRESHOLD,
            "max_rel_per_position_vs_row": THRESHOLD,
            "max_rel_state_vs_stock_f64": THRESHOLD,
            "max_rel_per_position_state_vs_stock_f64": THRESHOLD,
        }
    ),
    "verify_gpu": mapping(
        {
            "max_rel_fp32": THRESHOLD,
            "max_rel_per_position_fp32": THRESHOLD,
            "fp16_max_over_floor": positive_number,
            "section_fraction": positive_number,
            "section_min_bytes": positive_number,
            "section_work": positive_number,
            "layers": one_of(*GPU_DEPTHS),
            "held_to_floor": subset_of(*GPU_HALF_MODES),
        }
    ),
    "weights": pipeline_weights,
    "decision": mapping(
        {
            "scored_tokens": count,
            "pair_scored_tokens": count,
            "max_kld_mean": mapping({place: THRESHOLD for place in DECISION_PLACES}),
            "min_same_top": mapping({place: fraction for place in DECISION_PLACES}),
            "enforced": subset_of(*DECISION_PLACES),
            "held_at_weights": weights_list,
        }
    ),
    "bundle": mapping({"bytes_goal_over_graph": factor, "memory_goal_over_graph": factor}),
    "release": mapping(
        {
            "host_weights": one_of(*HOST_WEIGHT_MODES),
            "host_weights_precision": host_precision,
            "signing_key": optional_path,
            "max_over_recorded": factor,
            "layout": one_of(*RELEASE_LAYOUTS),
        }
    ),
}


def check_section(params: dict, section: str, path: str | Path = "params.yaml"):
    """One section present and valid -> its value."""
    if section not in params:
        raise ClefError(f"{path}: missing section `{section}`")
    return SCHEMA[section](params[section], section)


def check_all(params: dict, path: str | Path = "params.yaml") -> ForeignJson:
    """The whole file: every section of SCHEMA present and valid, no section it does not know."""
    for key in params:
        if key not in SCHEMA:
            raise ClefError(f"{path}: unknown section {key}{did_you_mean(key, SCHEMA)}")
    for section in SCHEMA:
        check_section(params, section, path)
    return params


# ---------------------------------------------------------------------------------------------
# rules that need the snapshot, and the readers the stages use


def within_context(what: str, positions: int, max_positions: int) -> None:
    """A graph over `positions` tokens must fit the model's max_position_embeddings (M-RoPE's table)."""
    if positions > max_positions:
        raise ClefError(f"{what} is above the model's max_position_embeddings ({max_positions})")


def check_context(params: dict, max_positions: int) -> None:
    """Every row graph length and every pair's prefix + suffix within the snapshot's context."""
    for n in params["lengths"]:
        within_context(f"params.yaml: length {n}", n, max_positions)
    for q in params["pairs"]:
        within_context(
            f"params.yaml: pair {q}: prefix + suffix = {q['prefix'] + q['suffix']}",
            q["prefix"] + q["suffix"],
            max_positions,
        )


def positive_numbers(section, keys: tuple[str, ...], name: str) -> Limits:
    """params.yaml section `name` -> {key: value} for `keys`, each a positive finite number."""
    if not isinstance(section, dict):
        raise ClefError(f"params.yaml: `{name}` must be a mapping with {', '.join(keys)}")
    return {key: positive_number(section.get(key), f"{name}.{key}") for key in keys}


def bounds(params: dict, section: str, keys: tuple[str, ...]) -> Limits:
    """The bounds `max_<key>` of a verify section -> {key: bound}: each names the row figure it bounds
    (scripts/checks/compare.py), and each must be a positive number."""
    found = positive_numbers(params.get(section), tuple(f"max_{k}" for k in keys), section)
    return {k[4:]: v for k, v in found.items()}


def min_over_threshold(params: dict) -> float:
    """controls.min_over_threshold: how far past its bound a check's fault must take its figure."""
    return positive_numbers(params.get("controls"), ("min_over_threshold",), "controls")["min_over_threshold"]


def parse_yaml(text: str, path: str | Path = "params.yaml"):
    """YAML text as DVC reads params.yaml (ruamel's safe loader, YAML 1.2: `0200` is 200, `2:08` a
    string, `1e-4` a number), so the schema checks the values the stages are given; `yes` and `no`
    stay strings. Unparsable text is one line naming the file."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        return YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise ClefError(f"{path} is not valid YAML: {exc}") from None


def read(path: str | Path = "params.yaml") -> ForeignJson:
    """params.yaml parsed as DVC parses it, or one line saying why it cannot be."""
    path = Path(path)
    if not path.is_file():
        raise ClefError(f"no params file at {path}")
    params = parse_yaml(path.read_text(), path)
    if not isinstance(params, dict):
        raise ClefError(f"{path} must hold a mapping of sections")
    return params


def bound_section(section: str, path: str | Path = "params.yaml") -> ForeignJson:
    """A section of pass/fail bounds (scripts/pipeline/bounds.py: `memory`, `stack`), checked. A stage reads
    it without declaring it in dvc.yaml, so a new value reruns no stage; check_params holds the records."""
    return check_section(read(path), section, path)


def load(sections=None, path: str | Path = "params.yaml") -> ForeignJson:
    """params.yaml with `sections` present and checked (a stage asks for the sections it declares in
    dvc.yaml; `section.key` declares one key, so that DVC reruns the stage when that key changes and not
    when the rest of the section does, and checks its whole section), or, without `sections`, the whole
    file checked. A bad value is a ClefError naming it."""
    params = read(path)
    if sections is None:
        return check_all(params, path)
    for section in sections:
        check_section(params, section.split(".", 1)[0], path)
    return params
