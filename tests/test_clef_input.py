"""`clef` on input it cannot use, with no release built: text that is not UTF-8 and manifests of the
wrong shape are one line naming the input and the problem (exit 2), never an exception's class name,
and nothing is written or removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scripts.litert import precision_probe, tflite_file
from scripts.release import reader
from tests.conftest import assert_one_line_error, clef, clef_without_torch, tool_env, tree


def clef_bytes(cwd: Path, *args: str | bytes) -> subprocess.CompletedProcess:
    """The `clef` command with raw argv bytes, as a shell passes text that is not UTF-8."""
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "clef").encode(),
            *(a if isinstance(a, bytes) else a.encode() for a in args),
        ],
        cwd=cwd,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    "args, named",
    [
        ([b"--text", b"abc\xff"], "--text is not valid UTF-8 (byte 0xff at offset 3)"),
        ([b"--pair", b"--text", b"context", b"--question", b"q\xe9?"], "--question is not valid UTF-8 (byte 0xe9 at"),
    ],
)
def test_clef_run_refuses_text_that_is_not_utf8(tmp_path, args, named):
    """Checked before the release is opened (there is none here): the bad byte and where it is."""
    proc = clef_bytes(tmp_path, "run", "--release", str(tmp_path / "absent"), *args)
    line = assert_one_line_error(proc, named)
    assert "Error" not in line and not list(tmp_path.iterdir()), line


def probe_graph(path: Path) -> Path:
    """A small .tflite with clef_litert metadata (the precision probe's one FULLY_CONNECTED): enough for
    `clef audit` to read it and go on to the manifest beside it."""
    raw = path.with_suffix(".raw")
    raw.write_bytes(precision_probe.graph_bytes(np.zeros((precision_probe.COLUMNS, precision_probe.K), np.float32)))
    meta = {
        "kind": "row",
        "L": 64,
        "repo": "clef-litert/test",
        "revision": "0" * 40,
        "source": "test",
        "form": "R64",
        "weights": "fp32",
        "contract_version": 2,
        "versions": {},
    }
    tflite_file.write_with_metadata(raw, path, meta)
    raw.unlink()
    return path


# (manifest.json's text, what the line says of it)
BAD_MANIFESTS = [
    ("[1, 2]", "manifest.json is not a JSON object (a list)"),
    ("3", "manifest.json is not a JSON object (a number)"),
    ('"release"', "manifest.json is not a JSON object (a string)"),
    (
        json.dumps({"format": reader.FORMAT, "artifacts": ["row_L64"], "files": {}}),
        "manifest.json: `artifacts` is not a JSON object (a list)",
    ),
    (
        json.dumps({"format": reader.FORMAT, "artifacts": {"row_L64": 64}, "files": {}}),
        "manifest.json: `artifacts` entry 'row_L64' is not a JSON object (a number)",
    ),
    (
        json.dumps({"format": reader.FORMAT, "artifacts": {}, "files": {"bundle/g.tflite": "abc"}}),
        "manifest.json: `files` entry 'bundle/g.tflite' is not a JSON object (a string)",
    ),
]


@pytest.mark.parametrize("command", ["verify", "run", "audit"])
@pytest.mark.parametrize("text, named", BAD_MANIFESTS)
def test_clef_refuses_a_manifest_of_the_wrong_shape(tmp_path, command, text, named):
    """Valid JSON that is not a manifest's shape: one line naming the file and what it is, in each
    command that reads a manifest (reader.load_manifest), not `'list' object has no attribute 'get'`."""
    release = tmp_path / "release"
    (release / "bundle").mkdir(parents=True)
    (release / reader.MANIFEST).write_text(text)
    if command == "audit":
        probe_graph(release / "bundle" / "g.tflite")
    before = tree(tmp_path)
    args = {
        "verify": ["verify", str(release)],
        "run": ["run", "--release", str(release), "--text", "hello"],
        "audit": ["audit", str(release / "bundle" / "g.tflite")],
    }[command]
    line = assert_one_line_error(clef(tmp_path, *args), str(release / named))
    assert "Error" not in line and "attribute" not in line, line
    assert tree(tmp_path) == before


def tarball(path: Path, members: dict[str, bytes | str]) -> Path:
    """A .tar.zst holding `members` (name -> bytes, or -> a symlink's target), compressed as
    scripts/release/builder.py compresses a release."""
    import io
    import tarfile

    from scripts.release import builder

    with open(path, "wb") as raw, builder.compressor(1).stream_writer(raw) as zst:
        with tarfile.open(fileobj=zst, mode="w|") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                if isinstance(data, str):
                    info.type, info.linkname = tarfile.SYMTYPE, data
                    tar.addfile(info)
                    continue
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "members, named",
    [
        ({"release/manifest.json": b"{}", "../outside.txt": b"x"}, "refused a member: "),
        ({"release/manifest.json": b"{}", "release/passwd": "/etc/passwd"}, "refused a member: "),
        ({"one/manifest.json": b"{}", "two/manifest.json": b"{}"}, "holds ['one', 'two'], not one release directory"),
    ],
)
def test_a_tarball_that_is_not_one_release_is_one_line_and_leaves_nothing(tmp_path, members, named):
    path = tarball(tmp_path / "release.tar.zst", members)
    before = tree(tmp_path)
    assert_one_line_error(clef(tmp_path, "verify", str(path)), str(path), named)
    assert tree(tmp_path) == before and not (tmp_path.parent / "outside.txt").exists()


def test_a_cut_tarball_is_one_line(tmp_path):
    path = tarball(tmp_path / "release.tar.zst", {"release/manifest.json": b"{}" * 5000})
    path.write_bytes(path.read_bytes()[:40])
    assert_one_line_error(clef(tmp_path, "verify", str(path)), "is not a whole release tarball")


def test_version_names_the_release_format_and_needs_no_torch(tmp_path):
    """`clef --version`, with torch, transformers and litert-torch made unimportable (a device team's venv)."""
    proc = clef_without_torch(tmp_path, "--version")
    assert proc.returncode == 0 and proc.stdout.strip().endswith(f"reads release format {reader.FORMAT}"), proc
    assert proc.stdout.startswith("clef-litert ")
