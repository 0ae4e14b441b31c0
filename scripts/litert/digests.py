"""What a refactor must leave unchanged, as one JSON document: the content digest of every graph
(tflite_file.content_digest: the file without its metadata entry, which names the commit) and the
sha256 of every reference record. Run it before and after a change at the same params and compare:

    python -m scripts.litert.digests > before.json   # ... change, dvc repro ...
    python -m scripts.litert.digests | diff before.json -
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scripts.checkpoint import snapshot
from scripts.litert import tflite_file
from scripts.pipeline import layout
from scripts.pipeline.mappings import FileDigests

GRAPHS = (layout.ROWS, layout.PAIRS, layout.BUNDLE)


def digests(root: Path = Path(".")) -> FileDigests:
    """{path: digest} of the graphs under GRAPHS and the records under results/references/."""
    out = {}
    for folder in GRAPHS:
        for path in sorted((root / folder).glob("*.tflite")):
            out[str(path.relative_to(root))] = tflite_file.content_digest(path)
    for path in sorted((root / layout.REFERENCES).glob("*.safetensors")):
        out[str(path.relative_to(root))] = snapshot.sha256_file(path)
    return out


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, indent=1)
    print()
