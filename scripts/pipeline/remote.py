"""A DVC remote checked before a pull: it is configured, its endpoint answers, its bucket and path exist.

`dvc pull` from a missing bucket says only that cache files are missing ("Is your cache up to date?"),
and from a wrong endpoint several lines of retries; this names the cause in one line first.
"""

from __future__ import annotations

from pathlib import Path

from scripts.pipeline.errors import ClefError

BUCKETED = ("s3", "gs", "azure")  # remotes whose path begins with a bucket (container)


def check(repo_root: Path, name: str | None = None) -> str:
    """The remote `name` (default: the repository's default remote) -> a description of it, or a
    ClefError naming what is wrong: none configured, unknown name, unreachable, no bucket, no data."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        repo = Repo(str(repo_root))
    except DvcException as exc:
        raise ClefError(f"{repo_root} is not a DVC repository: {exc}") from None
    with repo:
        configured = repo.config["remote"]
        name = name or repo.config["core"].get("remote")
        if not name:
            raise ClefError(
                'no default DVC remote: add one with `dvc remote add -d NAME URL` (docs/pipeline.md, "DVC")'
            )
        if name not in configured:
            raise ClefError(f"no DVC remote {name!r}; configured: {', '.join(configured) or 'none'}")
        url = configured[name]["url"]
        endpoint = configured[name].get("endpointurl")
        where = f"{name} ({url}{' at ' + endpoint if endpoint else ''})"
        try:
            remote = repo.cloud.get_remote(name)
            fs, path = remote.fs, remote.path
            if fs.exists(path):
                return where
            protocol = url.split("://", 1)[0] if "://" in url else "local"
            bucket = path.split("/", 1)[0]
            if protocol in BUCKETED and not fs.exists(bucket):
                raise ClefError(f"remote {where}: bucket {bucket!r} does not exist")
        except ClefError:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure to reach the store means the same thing here)
            raise ClefError(f"remote {where}: cannot reach it: {type(exc).__name__}: {exc}") from None
        raise ClefError(f"remote {where}: {path} does not exist: nothing has been pushed there")
