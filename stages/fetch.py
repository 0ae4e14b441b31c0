"""DVC stage `fetch`: the checkpoint snapshot under hf/ and its file record, results/snapshot.json.

model.source tiny writes the embedded checkpoint; hub downloads model.repo at model.revision.
"""

from scripts.checkpoint import fetch
from scripts.pipeline import atomic, params
from scripts.pipeline.harness import run_stage


def main() -> None:
    model = params.load(["model"])["model"]
    rec = fetch.fetch(model)
    atomic.write_json("results/snapshot.json", rec.to_json())
    print(f"fetch: {rec.repo}@{rec.revision} ({rec.source}), {len(rec.files)} files")


if __name__ == "__main__":
    run_stage(main)
