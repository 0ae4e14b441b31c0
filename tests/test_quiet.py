"""scripts/pipeline/quiet.py: third-party noise off a stage's output, everything else through it at once,
and every line back with CLEF_DEBUG=1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scripts.pipeline import quiet
from tests.conftest import ROOT

NOISY = [  # lines seen in a `make release` log, one per source
    b"INFO: [accelerator_registry.cc:43] DestroyAccelerator: ptr=0x5568d9028650, name=GPU WebGPU\n",
    b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n",
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1796416807.539200    4587 port.cc:153] oneDNN custom operations are on.\n",
    b"I1204 20:30:01.123456    4587 flatbuffer_export.cc:4410] Estimated count of arithmetic ops: 0  ops\n",
    b"W1204 20:30:01.123456    4587 gl_delegate.cc:12] a warning\n",
]
KEPT = [
    b"export: artifacts/rows/row_L64.tflite (4.0 MiB) in 27 s\n",
    b"error: stack: hf/ is missing\n",
    b"E1204 20:30:01.123456    4587 runtime.cc:9] an error the runtime logs\n",
    b"ERROR: the runtime failed\n",
    b"Traceback (most recent call last):\n",
    b"WARNING: something else\n",
    b"note INFO: in the middle of a line\n",
]


def run_all(chunks: list[bytes]) -> bytes:
    out, pending = b"", b""
    for chunk in chunks:
        now, pending = quiet.filtered(chunk, pending)
        out += now
    return out + pending


def test_noise_dropped_and_the_rest_kept_whole():
    assert run_all([b"".join(NOISY + KEPT)]) == b"".join(KEPT)


def test_a_line_split_across_reads_is_judged_whole():
    data = b"".join(NOISY[:2] + KEPT[:1] + NOISY[3:4] + KEPT[1:2])
    assert run_all([data[i : i + 7] for i in range(0, len(data), 7)]) == KEPT[0] + KEPT[1]


def test_a_progress_bar_passes_as_it_is_drawn():
    """tqdm redraws with \\r and no \\n: each redraw goes out at once, not when the bar ends."""
    out, pending = quiet.filtered(b"\rloading shards:  50%|#####", b"")
    assert out == b"\rloading shards:  50%|#####" and pending == b""
    out, pending = quiet.filtered(b"INF", b"")  # could still become noise: held
    assert out == b"" and pending == b"INF"


CHILD = r"""
import atexit, os, sys, warnings
from scripts.pipeline import quiet
quiet.install()
noisy, kept = {noisy!r}, {kept!r}
for line in noisy + kept:
    os.write(2, line)                       # as C++ writes: past Python's sys.stderr
os.write(1, noisy[0])                       # LiteRT logs some INFO lines on stdout
warn = "import warnings; warnings.warn({{!r}}, {{}})"
exec(compile(warn.format("deprecated inside a library", "FutureWarning"), "/usr/lib/python3/lib.py", "exec"))
exec(compile(warn.format("raised in our code", "UserWarning"), {ours!r}, "exec"))
atexit.register(lambda: os.write(2, {noisy_last!r}))  # the runtime's teardown, after Python's
print("a result line", flush=True)
"""


@pytest.mark.parametrize("debug", [False, True], ids=["default", "CLEF_DEBUG=1"])
def test_a_stage_process_shows_only_what_is_not_noise(debug):
    """Through a real process: C-level writes on both streams, Python warnings from a library and from our code, and a
    line written at exit. By default only the kept lines and our warning show; in debug mode, all."""
    code = CHILD.format(noisy=NOISY, kept=KEPT, ours=str(ROOT / "stages" / "x.py"), noisy_last=NOISY[0])
    env = {**os.environ, "PYTHONPATH": str(ROOT), quiet.DEBUG_ENV: "1" if debug else ""}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0 and b"a result line\n" in proc.stdout, proc
    assert (NOISY[0] in proc.stdout) == debug
    err = proc.stderr
    for line in KEPT:
        assert line in err
    assert b"raised in our code" in err
    if debug:
        assert all(line in err for line in NOISY) and b"deprecated inside a library" in err
    else:
        assert not any(line in err for line in NOISY), err.decode()
        assert b"deprecated inside a library" not in err
