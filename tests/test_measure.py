"""scripts/pipeline/measure.py: the sampled peak of anonymous memory sees an allocation that comes and
goes, and does not count the pages of a file mapped read-only, which peak RSS does count."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

import pytest

from scripts.pipeline import measure

ROOT = Path(__file__).resolve().parents[1]

MB = 2**20


@pytest.mark.parametrize(("budget", "timed"), [(None, 7), (100.0, 7), (0.05, 3), (0.0, 3)])
def test_a_latency_median_stops_after_three_calls_once_its_budget_is_spent(budget, timed):
    """verify_tflite's latency: a slow graph is timed 3 times, not latency_repeats times; never fewer."""
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.03)

    times = measure.timed_runs(slow, 7, budget)
    assert len(times) == timed and min(times) >= 0.03
    assert len(calls) == 1 + timed  # the warm-up, then the timed calls
    # the latency record says how many runs it timed, not only how many it could have
    from scripts.checks import tflite_check

    record = tflite_check.latency(times, times[:1] + times, 7, budget)
    assert record.timed_runs == tflite_check.TimedRuns(litert=timed, torch=timed + 1) and record.repeats == 7


def test_anon_peak_sees_a_transient_allocation():
    sampler = measure.AnonPeak(interval=0.005).start()
    before = measure.memory_status().anon
    block = bytearray(300 * MB)  # zero-filled by Python: every page is touched, so resident
    time.sleep(0.1)
    del block
    time.sleep(0.05)
    peak = sampler.stop()
    assert peak >= before + 280 * MB, (peak, before)
    assert measure.memory_status().anon < peak - 200 * MB  # it was freed; the peak remembers it


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_anon_peak_is_sampled_while_this_process_holds_the_gil():
    """As LiteRT does while it compiles a graph for the GPU: with a 10 s switch interval, no other
    thread of this process runs while the main thread computes, so a sampling thread would see
    neither the allocation nor its release."""
    import sys

    interval = sys.getswitchinterval()
    sampler = measure.AnonPeak(interval=0.005).start()
    time.sleep(0.2)  # the sampler process is up
    before = measure.memory_status().anon
    sys.setswitchinterval(10.0)
    try:
        block = bytearray(300 * MB)
        busy(0.3)
        del block
        busy(0.1)
    finally:
        sys.setswitchinterval(interval)
    assert sampler.stop() >= before + 280 * MB


@pytest.mark.parametrize("ending", ["stage refuses its input", "process dies unstopped"])
def test_the_sampler_leaves_nothing_on_the_stage_stderr(ending):
    """A stage that refuses bad input exits through run_stage's context; a process killed outright
    never stops its sampler, which then finds a zombie or nothing, and a closed pipe. Either way the
    stage's stderr holds only the stage's own line (before, a sampler's traceback followed it)."""
    import subprocess
    import sys

    body = {
        "stage refuses its input": "from scripts.pipeline.errors import ClefError\n"
        "from scripts.pipeline.harness import run_stage\n"
        "def main():\n    raise ClefError('bad input')\nrun_stage(main, budget=False)",
        "process dies unstopped": "import os, time\nfrom scripts.pipeline import measure\n"
        "measure.AnonPeak().start()\ntime.sleep(0.2)\nos._exit(3)",
    }[ending]
    # the sampler inherits the stderr pipe, so this returns only once the sampler has exited too
    proc = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == (2 if ending.startswith("stage") else 3), proc
    expected = ["error: bad input"] if ending.startswith("stage") else []
    assert proc.stderr.splitlines() == expected, proc.stderr


def test_shared_memory_counts_as_anonymous():
    """Shared anonymous and memfd pages (where lavapipe keeps GPU buffers) cannot be dropped either."""
    before = measure.memory_status().anon
    with mmap.mmap(-1, 200 * MB) as m:  # MAP_SHARED | MAP_ANONYMOUS: RssShmem, not RssAnon
        m.write(b"\1" * (200 * MB))
        during = measure.memory_status().anon
    assert during - before >= 180 * MB, (before, during)


def test_a_mapped_file_is_resident_but_not_anonymous(tmp_path):
    path = tmp_path / "weights.bin"
    with open(path, "wb") as f:
        f.truncate(200 * MB)
    before = measure.memory_status()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        total = sum(m[i] for i in range(0, len(m), 4096))  # touch every page
        during = measure.memory_status()
    assert total == 0
    assert during.file - before.file >= 180 * MB, (before, during)
    assert during.anon - before.anon < 50 * MB, (before, during)


def test_peak_rss_is_the_process_own_not_its_parent(tmp_path):
    """A stage started by a process holding 400 MB reports its own peak (ru_maxrss would report the
    parent's: Linux keeps it across exec)."""
    import subprocess
    import sys

    held = bytearray(400 * MB)  # noqa: F841  (resident in this, the parent, process)
    code = "from scripts.pipeline import measure; print(measure.peak_rss_bytes())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert int(out.stdout) < 300 * MB, int(out.stdout)


def set_memory(workdir: Path, **values) -> None:
    import yaml

    path = workdir / "params.yaml"
    p = yaml.safe_load(path.read_text())
    p["memory"].update(values)
    path.write_text(yaml.safe_dump(p, sort_keys=False))


def test_the_budget_counts_the_stack(tmp_path):
    import json
    import shutil

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    set_memory(tmp_path, factor=1.5, overhead_gib=0.5)
    before = measure.memory_budget(2**30, tmp_path)
    assert before.fp32_stack_bytes is None and before.limit_bytes == 2**29 and not before.within
    (tmp_path / "results").mkdir()
    (tmp_path / "results/stack.json").write_text(json.dumps({"fp32_bytes": 2**30}))
    after = measure.memory_budget(2**30, tmp_path)
    assert after.limit_bytes == 2**31 and after.within


def test_a_stage_over_its_memory_budget_fails_and_records_it(workdir):
    """The budget is a stage failure: the tiny `stack` stage (a few hundred MiB of anonymous memory)
    held to 50 MiB fails with one line naming it, after recording what it used; at the committed
    budget the same stage passes."""
    import json

    from tests.conftest import run_stage

    set_memory(workdir, overhead_gib=0.05)
    proc = run_stage("stack", workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]  # after the load's progress bar
    assert len(errors) == 1 and proc.stderr.splitlines()[-1] == errors[0], proc.stderr[-2000:]
    assert "stack: peak anonymous memory" in errors[0] and "over its budget" in errors[0], errors[0]
    assert "params.yaml memory: 1.3 x the fp32 stack" in errors[0], errors[0]
    rec = json.loads((workdir / "results/runtime/stack.json").read_text())
    assert rec["memory_budget"]["within"] is False
    assert rec["peak_anon_bytes"] > rec["memory_budget"]["limit_bytes"]

    set_memory(workdir, overhead_gib=2.0)
    proc = run_stage("stack", workdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((workdir / "results/runtime/stack.json").read_text())
    assert rec["memory_budget"]["within"] is True and rec["memory_budget"]["fp32_stack_bytes"] > 0
    # where its time went (scripts/pipeline/profile.py): the snapshot's hashes and the load, within its wall time
    assert rec["parts"]["hashing"] > 0 and rec["parts"]["load the stack"] > 0, rec["parts"]
    assert sum(rec["parts"].values()) <= rec["seconds"], rec


def test_a_peak_over_its_budget_never_reads_as_equal_to_it():
    """Broken once: `0.01 GiB is over its budget 0.01 GiB` (both rounded to two decimals)."""
    assert measure.distinct_gib(int(0.0137 * 2**30), int(0.0098 * 2**30)) == ("0.014", "0.010")
    assert measure.distinct_gib(7 * 2**30, 6 * 2**30) == ("7.00", "6.00")
