"""DVC stage `check_lengths`: every row graph length and pair within the snapshot's context.

The one params rule that needs the checkpoint (max_position_embeddings is in its config.json), so it
runs after fetch and before every stage that reads `lengths` or `pairs`: a graph longer than the
model's context is refused in a second, not after minutes of work or an out-of-memory kill. Its
output, like check_params's, is constant and persistent.
"""

from scripts.checkpoint import snapshot
from scripts.pipeline import atomic, layout, params
from scripts.pipeline.harness import run_stage


def main() -> None:
    p = params.load(["lengths", "pairs"])
    path = snapshot.verify(snapshot.load_record(), names=["config.json"])
    max_positions = snapshot.max_positions(path)
    params.check_context(p, max_positions)
    atomic.write_text(
        layout.LENGTHS_CHECKED, "params.yaml lengths and pairs fit the snapshot's max_position_embeddings\n"
    )
    print(f"check_lengths: lengths {p['lengths']} and {len(p['pairs'])} pairs within {max_positions} positions")


if __name__ == "__main__":
    run_stage(main)
