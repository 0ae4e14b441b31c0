"""A stage's progress through its named phases: a tqdm bar on stderr naming the phase under way.

For stages whose phases each take minutes at clef-flash's widths (load the stack, the torch references,
the interpreter packing its weights, the records) and print nothing until their result line. The
phases are declared up front, so the bar's total is the truth; naming one not declared is a bug in the
stage and raises. tqdm's redraws pass the quiet filter (scripts/pipeline/quiet.py) as they are.
"""

from __future__ import annotations

from collections.abc import Sequence


class Phases:
    """`with Phases("verify_tflite L=64", names) as phase: phase("torch references") ...`: each call
    starts the named phase and counts the one before it done; leaving the block counts the last."""

    def __init__(self, what: str, names: Sequence[str]):
        self.what, self.names, self.current = what, list(names), None
        self.bar = None

    def __enter__(self) -> Phases:
        from tqdm import tqdm

        self.bar = tqdm(
            total=len(self.names),
            desc=self.what,
            bar_format="{desc}: {n_fmt}/{total_fmt} phases{postfix} [{elapsed}]",
            mininterval=0,
        )
        return self

    def __call__(self, name: str) -> None:
        if name not in self.names:
            raise ValueError(f"{self.what}: phase {name!r} is not one of the declared {self.names}")
        if self.current is not None:
            self.bar.update(1)
        self.current = name
        self.bar.set_postfix_str(name)

    def __exit__(self, kind, *_) -> None:
        if kind is None and self.current is not None:
            self.bar.update(1)
        self.bar.close()
