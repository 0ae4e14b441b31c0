"""scripts/pipeline/mappings.py: the names for maps keyed by data stay plain dicts and pull in nothing heavy."""

import subprocess
import sys

from scripts.pipeline import mappings


def test_the_names_are_dicts_of_what_they_say():
    assert mappings.Tensors.__origin__ is dict and mappings.Tensors.__args__[1] == "torch.Tensor"
    assert mappings.FileDigests == dict[str, str]
    assert mappings.Shapes == dict[str, tuple[int, ...]]


def test_importing_it_does_not_import_torch():
    # guards against a stage that only reads JSON paying torch's import through a type name
    code = "import sys, scripts.pipeline.mappings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
