"""scripts/pipeline/measure.py: the sampled peak of anonymous memory sees an allocation that comes and
goes, and does not count the pages of a file mapped read-only, which peak RSS does count."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

from scripts.pipeline import measure

ROOT = Path(__file__).resolve().parents[1]

MB = 2**20


def test_anon_peak_sees_a_transient_allocation():
    sampler = measure.AnonPeak(interval=0.005).start()
    before = measure.memory_status()["anon"]
    block = bytearray(300 * MB)  # zero-filled by Python: every page is touched, so resident
    time.sleep(0.1)
    del block
    time.sleep(0.05)
    peak = sampler.stop()
    assert peak >= before + 280 * MB, (peak, before)
    assert measure.memory_status()["anon"] < peak - 200 * MB  # it was freed; the peak remembers it


def test_a_mapped_file_is_resident_but_not_anonymous(tmp_path):
    path = tmp_path / "weights.bin"
    with open(path, "wb") as f:
        f.truncate(200 * MB)
    before = measure.memory_status()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        total = sum(m[i] for i in range(0, len(m), 4096))  # touch every page
        during = measure.memory_status()
    assert total == 0
    assert during["file"] - before["file"] >= 180 * MB, (before, during)
    assert during["anon"] - before["anon"] < 50 * MB, (before, during)


def test_peak_rss_is_the_process_own_not_its_parent(tmp_path):
    """A stage started by a process holding 400 MB reports its own peak (ru_maxrss would report the
    parent's: Linux keeps it across exec)."""
    import subprocess
    import sys

    held = bytearray(400 * MB)  # noqa: F841  (resident in this, the parent, process)
    code = "from scripts.pipeline import measure; print(measure.peak_rss_bytes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert int(out.stdout) < 300 * MB, int(out.stdout)
