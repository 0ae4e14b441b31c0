"""The GPU route over LiteRT's C API (scripts/litert/litert_c.py) and the precision probe
(scripts/litert/precision_probe.py): the route reproduces the Python wrapper's fp16 and fp32 exactly,
each mode is shown by its effect, an option the runtime ignores is caught, and a missing C API symbol
is one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from scripts.litert import export, gpu_accelerator, litert_c, precision_probe
from scripts.pipeline.errors import ClefError
from tests.conftest import ROOT

WRAPPER = """
import json, sys
import numpy as np
from ai_edge_litert.hardware_accelerator import HardwareAccelerator
from scripts.litert import gpu_accelerator
path, out = sys.argv[1], sys.argv[2]
feeds = dict(np.load(sys.argv[3]))
result = {}
for mode, fp32 in (("fp32", True), ("fp16", False)):
    model, log, error = gpu_accelerator.load(path, HardwareAccelerator.GPU, fp32)
    assert error is None, error
    run = gpu_accelerator.signature_runner(model, path, None, quiet_runs=True)
    for name, value in run(**feeds).items():
        result[f"{mode}/{name}"] = value
np.savez(out, **result)
"""


class Mixer(torch.nn.Module):
    """A few op kinds the release's graphs hold (FULLY_CONNECTED, LOGISTIC, MUL, ADD)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.proj = torch.nn.Linear(256, 64)

    def forward(self, x):
        h = self.proj(x)
        return {"y": torch.sigmoid(h) * h + 1.0}


def wrapper_outputs(path, feeds: dict, tmp_path) -> dict:
    """The Python wrapper's fp32 and fp16 outputs, in a process of its own (the wrapper links its own
    copy of the runtime)."""
    np.savez(tmp_path / "feeds.npz", **feeds)
    out = tmp_path / "wrapper.npz"
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(path), str(out), str(tmp_path / "feeds.npz")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(np.load(out))


@pytest.mark.parametrize("graph", ["probe", "mixer"])
def test_the_c_route_at_precision_1_and_2_reproduces_the_wrappers_fp16_and_fp32_exactly(graph, tmp_path):
    """The route sets the precision itself; were its fp16 or fp32 not the wrapper's (another option, a
    struct read wrongly, inputs laid out differently), the outputs would differ in some bit."""
    if graph == "probe":
        path, feeds = precision_probe.graph_path(), {"x": precision_probe.inputs()[0]}
    else:
        path, x = tmp_path / "mixer.tflite", torch.randn(1, 32, 256)
        export.convert(Mixer().eval(), {"x": x}, path)
        feeds = {"x": x.numpy()}
    theirs = wrapper_outputs(path, feeds, tmp_path)
    assert litert_c.PRECISION["fp16"] == 1 and litert_c.PRECISION["fp32"] == 2
    for mode in ("fp32", "fp16"):
        compiled = gpu_accelerator.compile(path, mode)
        try:
            ours = compiled.signature()(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        finally:
            compiled.close()
        for name, value in ours.items():
            np.testing.assert_array_equal(value.numpy(), theirs[f"{mode}/{name}"])
    # and the two modes differ, so the equality above is not fp32 twice
    assert not np.array_equal(theirs["fp32/y"], theirs["fp16/y"])


def test_each_mode_is_shown_by_its_effect_on_the_probe():
    """Three arithmetics, three probe errors an order of magnitude and more apart."""
    proofs = {mode: gpu_accelerator.prove_mode(mode) for mode in litert_c.MODES}
    assert {m: p.arithmetic for m, p in proofs.items()} == {m: m for m in litert_c.MODES}
    assert proofs["fp32"].probe_error < 1e-5 < proofs["mixed"].probe_error < 1e-3 < proofs["fp16"].probe_error
    low, high = precision_probe.CLASS_EDGES
    assert precision_probe.arithmetic(low / 2) == "fp32" and precision_probe.arithmetic(low * 2) == "mixed"
    assert precision_probe.arithmetic(high * 2) == "fp16" and precision_probe.arithmetic(float("inf")) == "fp16"
    assert precision_probe.arithmetic(float("nan")) == "fp16"  # NaN never passes as a precise mode


@pytest.mark.parametrize("mode", ["mixed", "fp32"])
def test_an_option_the_runtime_ignores_is_caught(mode, monkeypatch):
    """The runtime logs a payload it cannot parse and compiles in fp16, still fully accelerated: the
    probe shows it, and the mode is refused in one line instead of passing as fp16."""
    monkeypatch.setattr(litert_c, "gpu_payload", lambda precision: f"precision = = {precision}\n".encode())
    with pytest.raises(ClefError, match=f"GPU mode {mode} did not take effect .* is fp16 arithmetic's"):
        gpu_accelerator.prove_mode(mode)


def test_an_unknown_mode_is_one_line():
    with pytest.raises(ClefError, match="unknown GPU precision 'fp8': one of fp32, fp16, mixed"):
        gpu_accelerator.compile(precision_probe.graph_path(), "fp8")


def test_a_missing_c_api_symbol_is_one_line_naming_it(monkeypatch):
    """Another ai-edge-litert may lack a function the route calls: the first GPU compile says which,
    before any graph is loaded."""
    monkeypatch.setitem(litert_c.SIGNATURES, "LiteRtNoSuchFunction", [])
    litert_c.library.cache_clear()
    try:
        with pytest.raises(ClefError, match="does not export LiteRtNoSuchFunction"):
            gpu_accelerator.compile(precision_probe.graph_path(), "mixed")
    finally:
        monkeypatch.undo()
        litert_c.library.cache_clear()
    assert litert_c.missing_symbols(litert_c.library()) == []


def test_precision_names_are_the_c_api_enum():
    """The names the model card gives a device team are LiteRT's LiteRtDelegatePrecision values."""
    assert json.loads(json.dumps(litert_c.PRECISION_NAMES)) == {
        "fp32": "kLiteRtDelegatePrecisionFp32",
        "fp16": "kLiteRtDelegatePrecisionFp16",
        "mixed": "kLiteRtDelegatePrecisionFp16WithFp32Accum",
    }


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--gpu", "--precision", "fp8"], "unknown GPU precision 'fp8': one of fp32, fp16, mixed"),
        (["--precision", "mixed"], "--precision needs --gpu"),
    ],
)
def test_clef_run_refuses_a_bad_precision_in_one_line_before_opening_the_release(tmp_path, args, fragment):
    from tests.conftest import assert_one_line_error, clef

    proc = clef(tmp_path, "run", "--text", "hello", "--release", str(tmp_path / "no-release"), *args)
    assert_one_line_error(proc, fragment)
