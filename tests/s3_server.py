"""An S3-API server on loopback for DVC's s3 remotes: moto's server mode, in a thread of the test process.

`s3_server(*buckets)` starts it (on a free port) with those buckets and stops it when the block ends;
`add_s3_remote` points a repository's default DVC remote at it the way a team configures S3: the URL and
endpoint in the committed config, the credentials in the uncommitted `--local` one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}
REGION = "us-east-1"


@contextlib.contextmanager
def s3_server(*buckets: str):
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["access_key_id"],
            aws_secret_access_key=CREDENTIALS["secret_access_key"],
        )
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


def add_s3_remote(repo: Path, dvc, name: str, url: str, endpoint: str) -> None:
    """The default remote `name` at `url` on `endpoint`; `dvc(repo, *args)` runs a dvc command."""
    dvc(repo, "remote", "add", "--default", name, url)
    dvc(repo, "remote", "modify", name, "endpointurl", endpoint)
    dvc(repo, "remote", "modify", name, "region", REGION)
    set_credentials(repo, dvc, name)


def set_credentials(repo: Path, dvc, name: str) -> None:
    """Credentials stay in .dvc/config.local (git-ignored): each clone sets its own."""
    for key, value in CREDENTIALS.items():
        dvc(repo, "remote", "modify", "--local", name, key, value)
