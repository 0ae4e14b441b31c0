"""DVC stage `check_params`: all of params.yaml against scripts/pipeline/params.py's schema, the
signing key it names (scripts/release/signing.py), the held-out text's size against the records the
params ask for (scripts/checks/records.py), and every figure recorded under results/ against the
pass/fail bounds it sets (scripts/pipeline/bounds.py: no stage declares those, so none reruns for them),
before any other stage.

Every other stage depends on this stage's output, so DVC runs it first, and a refusal (one line, exit 2)
stops `dvc repro` before any stage has removed an output. The output only says that the check passed:
valid edits leave it byte-identical, so they rerun nothing that does not read what changed. It is a
persistent output (DVC does not delete it before the run), so a refused run leaves it in place too.
"""

from pathlib import Path

from scripts.checkpoint import corpus
from scripts.checks import records
from scripts.pipeline import atomic, bounds, layout, params
from scripts.pipeline.errors import ClefError, first_of
from scripts.pipeline.harness import run_stage
from scripts.release import signing


def main() -> None:
    p = params.load()
    if p["release"]["signing_key"]:  # a key that cannot sign fails here, not after every stage has run
        signing.load_private_key(p["release"]["signing_key"], repo=Path.cwd())
    if p["model"]["source"] != "synthetic":  # its records are random ids (scripts/checks/record_text.py)
        held_out = sum(f.bytes for f in corpus.load().held_out)
        scored = (p["decision"]["scored_tokens"], p["decision"]["pair_scored_tokens"])
        if problem := records.text_unfit(p["lengths"], p["pairs"], scored, held_out):
            raise ClefError(f"params.yaml: {problem}")
    failing = bounds.problems(p)
    if failing:
        raise ClefError(first_of(failing))
    atomic.write_text(layout.PARAMS_CHECKED, "params.yaml passed the schema of scripts/pipeline/params.py\n")
    print("check_params: params.yaml is valid")


if __name__ == "__main__":
    run_stage(main)
