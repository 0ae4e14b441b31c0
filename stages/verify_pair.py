"""DVC stage `verify_pair` (one per pair): the pair in torch and in the LiteRT interpreter, checked by
chaining against the row graph, its state against transformers' cache, state reuse and the op census
(scripts/checks/pair_check.py) -> results/pair_P{P}_S{S}.json and its metrics row
(scripts/checks/pair_verification.py). Fails, naming the row, past a bound, on a census violation, or when a
control does not break the bound by controls.min_over_threshold."""

from scripts.checkpoint import snapshot
from scripts.checks import pair_verification
from scripts.checks.finish import finish
from scripts.layers import kernel_form
from scripts.pipeline import cli, layout, params
from scripts.pipeline.harness import run_stage


def main() -> None:
    a = cli.pair_arguments()
    p = params.load(["form", "weights", "decision.pair_scored_tokens"])
    form = str(kernel_form.parse(p["form"]))
    limits = params.bounds(p, "verify_pair", pair_verification.BOUNDED)
    min_over = params.min_over_threshold(p)
    path = layout.pair_path(a.prefix, a.suffix)
    layout.require(path, "export_pair")
    rec = snapshot.load_record()
    snap = snapshot.verify(rec)
    found = pair_verification.verify(path, rec, snap, form, p["weights"], a.prefix, a.suffix, p["decision"])
    finish(pair_verification.result(found, limits, min_over))


if __name__ == "__main__":
    run_stage(main)
