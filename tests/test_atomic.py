"""scripts/pipeline/atomic.py: outputs replace their target whole, with the mode any new file gets."""

import os
import stat

import pytest

from scripts.pipeline import atomic


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_written_file_has_the_mode_open_gives_a_new_one(tmp_path, umask):
    """Not mkstemp's 0600, which left README.md and results/runtime/ unreadable to the rest of a team."""
    atomic.write_text(tmp_path / "out.json", "{}\n")
    (tmp_path / "plain.json").write_text("{}\n")
    assert mode(tmp_path / "out.json") == mode(tmp_path / "plain.json") == 0o666 & ~umask


def test_a_scratch_file_renamed_into_place_keeps_that_mode(tmp_path, umask):
    with atomic.scratch_file(tmp_path / "graph.tflite", ".tflite") as scratch:
        scratch.write_bytes(b"graph")
        os.replace(scratch, tmp_path / "graph.tflite")
    assert mode(tmp_path / "graph.tflite") == 0o666 & ~umask


def test_replacing_keeps_the_content_whole(tmp_path):
    atomic.write_text(tmp_path / "out.txt", "first\n")
    with pytest.raises(RuntimeError):
        with atomic.writing(tmp_path / "out.txt") as f:
            f.write(b"half")
            raise RuntimeError("killed midway")
    assert (tmp_path / "out.txt").read_text() == "first\n" and os.listdir(tmp_path) == ["out.txt"]
