"""params.yaml: read once, checked once, before any stage does heavy work.

Every rule about a parameter lives here; the stages and tests read the validated dict.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from scripts.errors import ClefError

SOURCES = ("tiny", "synthetic", "hub")
REVISION = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model(model) -> dict:
    if not isinstance(model, dict):
        raise ClefError("params.yaml: `model` must be a mapping with source, repo and revision")
    source = model.get("source")
    if source not in SOURCES:
        raise ClefError(f"params.yaml: unknown model.source {source!r}; valid sources: {', '.join(SOURCES)}")
    if source == "synthetic":
        layers = model.get("synthetic_layers")
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
            raise ClefError(f"params.yaml: model.synthetic_layers {layers!r} is not a positive integer "
                            "(the real-width synthetic checkpoint's layer count)")
    repo = model.get("repo")
    if not isinstance(repo, str) or not REPO.fullmatch(repo):
        raise ClefError(f"params.yaml: model.repo {repo!r} is not an <org>/<name> repository id")
    revision = model.get("revision")
    if not isinstance(revision, str) or not REVISION.fullmatch(revision):
        raise ClefError(
            f"params.yaml: model.revision {revision!r} is not a full 40-hex commit id; "
            "branch and tag names move, so a release pinned to one cannot be audited"
        )
    return model


def check_lengths(lengths) -> list[int]:
    """The row graph lengths: positive integers, each once."""
    if not isinstance(lengths, list) or not lengths:
        raise ClefError("params.yaml: `lengths` must be a non-empty list of positive integers")
    for n in lengths:
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ClefError(f"params.yaml: length {n!r} is not a positive integer")
    if len(set(lengths)) != len(lengths):
        raise ClefError(f"params.yaml: lengths {lengths} repeat a value")
    return lengths


def check_pairs(pairs) -> list[dict]:
    """The shared-state pairs: a list of {prefix, suffix}, positive integers, each pair once."""
    if not isinstance(pairs, list):
        raise ClefError("params.yaml: `pairs` must be a list of {prefix: P, suffix: S}")
    seen = set()
    for q in pairs:
        if not isinstance(q, dict) or set(q) != {"prefix", "suffix"}:
            raise ClefError(f"params.yaml: pair {q!r} must be a mapping with exactly prefix and suffix")
        for key in ("prefix", "suffix"):
            if not isinstance(q[key], int) or isinstance(q[key], bool) or q[key] <= 0:
                raise ClefError(f"params.yaml: pair {q!r}: {key} is not a positive integer")
        if (q["prefix"], q["suffix"]) in seen:
            raise ClefError(f"params.yaml: pair {q!r} is listed twice")
        seen.add((q["prefix"], q["suffix"]))
    return pairs


def positive_numbers(section, keys: tuple[str, ...], name: str) -> dict[str, float]:
    """params.yaml section `name` -> {key: value} for `keys`, each a positive finite number."""
    if not isinstance(section, dict):
        raise ClefError(f"params.yaml: `{name}` must be a mapping with {', '.join(keys)}")
    out = {}
    for key in keys:
        value = section.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ClefError(f"params.yaml: {name}.{key} {value!r} is not a positive number")
        out[key] = float(value)
    return out


def bounds(params: dict, section: str, keys: tuple[str, ...]) -> dict[str, float]:
    """The bounds `max_<key>` of a verify section -> {key: bound}: each names the row figure it bounds
    (scripts/compare.py), and each must be a positive number."""
    found = positive_numbers(params.get(section), tuple(f"max_{k}" for k in keys), section)
    return {k[4:]: v for k, v in found.items()}


def min_over_threshold(params: dict) -> float:
    """controls.min_over_threshold: how far past its bound a check's fault must take its figure."""
    return positive_numbers(params.get("controls"), ("min_over_threshold",), "controls")["min_over_threshold"]


# Sections with a check here; others (the form, thresholds) are checked by the module that owns them.
CHECKS = {"model": check_model, "lengths": check_lengths, "pairs": check_pairs}


def load(sections=(), path: str | Path = "params.yaml") -> dict:
    """params.yaml with `sections` present and checked: a stage asks for the sections it declares
    in dvc.yaml. A missing section or a bad value is a ClefError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ClefError(f"no params file at {path}")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ClefError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(params, dict):
        raise ClefError(f"{path} must hold a mapping of sections")
    for section in sections:
        if section not in params:
            raise ClefError(f"{path}: missing section `{section}`")
        if section in CHECKS:
            CHECKS[section](params[section])
    return params
