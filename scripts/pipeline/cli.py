"""The command lines the per-graph stages share: which row graph or pair a stage works on, as dvc.yaml's
foreach passes it (`--prefix P --suffix S` for a pair)."""

from __future__ import annotations

import argparse


def pair_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """`--prefix P --suffix S`, both required: the pair a per-pair stage (export_pair, verify_pair) makes
    or checks."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, required=True)
    ap.add_argument("--suffix", type=int, required=True)
    return ap.parse_args(argv)
