"""`clef pull` (scripts/pipeline/remote.py) on a small DVC repository with an S3 remote on loopback
(tests/s3_server.py): it pulls what was pushed, and a wrong endpoint, a missing bucket, a path nothing
was pushed to, an unknown or absent remote are each one line naming the cause, before `dvc pull` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, clef, dvc, git
from tests.s3_server import add_s3_remote, s3_server, set_credentials


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """A repository with one DVC-tracked file pushed to s3://team/store, and a git clone of it."""
    with s3_server("team") as endpoint:
        repo = tmp_path_factory.mktemp("remote") / "repo"
        repo.mkdir()
        git(repo, "init", "-q")
        dvc(repo, "init", "-q")
        (repo / "data.txt").write_text("what a team shares\n")
        dvc(repo, "add", "-q", "data.txt")
        add_s3_remote(repo, dvc, "team", "s3://team/store", endpoint)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "data and remote")
        assert "1 file pushed" in dvc(repo, "push")
        clone = repo.parent / "clone"
        git(repo.parent, "clone", "-q", str(repo), str(clone))
        set_credentials(clone, dvc, "team")
        yield {"repo": repo, "clone": clone, "endpoint": endpoint}


def test_clef_pull_fetches_what_was_pushed(pushed):
    clone: Path = pushed["clone"]
    proc = clef(clone, "pull")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (clone / "data.txt").read_text() == "what a team shares\n"
    assert f"pull: remote team (s3://team/store at {pushed['endpoint']})" in proc.stderr


@pytest.mark.parametrize(
    "change, fragments",
    [
        (("url", "s3://nobucket/store"), ["bucket 'nobucket' does not exist"]),
        (("endpointurl", "http://127.0.0.1:9"), ["at http://127.0.0.1:9): cannot reach it", "EndpointConnectionError"]),
        (("url", "s3://team/elsewhere"), ["team/elsewhere does not exist: nothing has been pushed there"]),
    ],
)
def test_clef_pull_names_what_is_wrong_with_the_remote(pushed, change, fragments):
    clone: Path = pushed["clone"]
    dvc(clone, "remote", "modify", "--local", "team", *change)  # the committed config stays as it was
    try:
        proc = clef(clone, "pull")
    finally:
        dvc(clone, "remote", "modify", "--local", "--unset", "team", change[0])
    assert_one_line_error(proc, "remote team (", *fragments)


def test_clef_pull_without_a_remote(pushed, tmp_path):
    assert_one_line_error(clef(pushed["clone"], "pull", "--remote", "nope"), "no DVC remote 'nope'; configured: team")
    git(tmp_path, "init", "-q")
    dvc(tmp_path, "init", "-q")
    assert_one_line_error(clef(tmp_path, "pull"), "no default DVC remote")
