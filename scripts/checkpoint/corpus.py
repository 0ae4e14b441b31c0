"""The text the embedded checkpoint is trained and judged on: source files of a pinned package.

Every machine that installs the project's lock file has the same bytes of `transformers`
(Apache-2.0) under site-packages, so its modeling files are a license-clean corpus that needs no
download. The committed manifest (scripts/checkpoint/corpus.json) names each file with its sha256
and its part: `train` (what the training reads) or `held_out` (other files, never trained on: the
quality figures and the checks' real-text records come from them). Reading the corpus checks every
file first and refuses the first missing or changed one in one line, before any work.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

from scripts.pipeline.errors import ClefError, first_of
from scripts.pipeline.records import Record

MANIFEST = Path(__file__).with_name("corpus.json")
PACKAGE = "transformers"
LICENSE = "Apache-2.0"
# Sorted modeling files; every HELD_OUT_EVERY-th one is held out, the rest train, each part up to its budget.
PATTERN = "models/*/modeling_*.py"
HELD_OUT_EVERY = 10
TRAIN_BYTES = 8_000_000
HELD_OUT_BYTES = 1_000_000
PARTS = ("train", "held_out")


@dataclasses.dataclass(frozen=True)
class CorpusFile(Record):
    path: str  # relative to site-packages
    sha256: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class CorpusManifest(Record):
    package: str
    version: str
    license: str
    train: list[CorpusFile]
    held_out: list[CorpusFile]

    def part(self, name: str) -> list[CorpusFile]:
        if name not in PARTS:
            raise ClefError(f"corpus part {name!r}: expected one of {', '.join(PARTS)}")
        return self.train if name == "train" else self.held_out


def site_packages() -> Path:
    """The site-packages the pinned package is installed in (this interpreter's)."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ClefError(f"corpus: package {PACKAGE} is not installed (make env installs the lock file)")
    return Path(spec.origin).parents[1]


def _entry(root: Path, path: Path) -> CorpusFile:
    data = path.read_bytes()
    return CorpusFile(str(path.relative_to(root)), hashlib.sha256(data).hexdigest(), len(data))


def build(root: Path) -> CorpusManifest:
    """The manifest of the installed package's files under `root`, split as PATTERN / HELD_OUT_EVERY say."""
    from importlib.metadata import version

    files = sorted((root / PACKAGE).glob(PATTERN))
    parts: dict[str, list[CorpusFile]] = {"train": [], "held_out": []}
    budget = {"train": TRAIN_BYTES, "held_out": HELD_OUT_BYTES}
    for i, path in enumerate(files):
        part = "held_out" if i % HELD_OUT_EVERY == 0 else "train"
        entry = _entry(root, path)
        if budget[part] >= entry.bytes:
            parts[part].append(entry)
            budget[part] -= entry.bytes
    return CorpusManifest(PACKAGE, version(PACKAGE), LICENSE, parts["train"], parts["held_out"])


def load(manifest: Path = MANIFEST) -> CorpusManifest:
    return CorpusManifest.read(manifest)


def problems(corpus: CorpusManifest, root: Path) -> list[str]:
    """Every file of the manifest that is missing under `root` or holds other bytes, in manifest order."""
    out = []
    for part in PARTS:
        for f in corpus.part(part):
            path = root / f.path
            if not path.is_file():
                out.append(f"corpus file {f.path} ({part}) is missing under {root}")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != f.sha256:
                out.append(f"corpus file {f.path} ({part}) has sha256 other than the manifest's {f.sha256[:12]}")
    return out


def checked(root: Path | None = None, manifest: Path = MANIFEST) -> CorpusManifest:
    """The manifest, after every file it names was found with its sha256; one line naming the first that
    was not otherwise (and how many more)."""
    corpus = load(manifest)
    root = site_packages() if root is None else root
    found = problems(corpus, root)
    if found:
        raise ClefError(first_of(found))
    if {f.path for f in corpus.train} & {f.path for f in corpus.held_out}:
        raise ClefError(f"{manifest}: a file is in both the train and the held-out part")
    return corpus


def text(corpus: CorpusManifest, part: str, root: Path | None = None) -> list[str]:
    """The files of `part`, each decoded as UTF-8, in manifest order (call after `checked`)."""
    root = site_packages() if root is None else root
    return [(root / f.path).read_text(encoding="utf-8") for f in corpus.part(part)]


SEPARATOR = "<|endoftext|>"
"""The special token between two files of a token stream (Qwen's tokenizers and the embedded one have it)."""


def token_stream(encode: Callable[[str], list[int]], separator: int, texts: list[str]) -> list[int]:
    """The files' tokens as one stream, `separator` after each file: what the embedded checkpoint is
    trained on (train part) and what the checks' records are windows of (held-out part)."""
    ids: list[int] = []
    for t in texts:
        ids.extend(encode(t))
        ids.append(separator)
    return ids


if __name__ == "__main__":
    import sys

    from scripts.pipeline import atomic
    from scripts.pipeline.errors import run_command

    def main() -> None:
        out = Path(sys.argv[1]) if len(sys.argv) > 1 else MANIFEST
        m = build(site_packages())
        atomic.write_json(out, m.to_json())
        print(
            f"corpus: {len(m.train)} train files ({sum(f.bytes for f in m.train):,} bytes), "
            f"{len(m.held_out)} held out ({sum(f.bytes for f in m.held_out):,} bytes) "
            f"of {m.package} {m.version} -> {out}"
        )

    run_command(main)
