"""A fake Hugging Face Hub on loopback: one repository, served in the hub's API shape.

Just enough of the hub for `huggingface_hub` 1.x to run `HfApi().model_info(..., files_metadata=True)`
and `snapshot_download(repo, revision=<40 hex>, allow_patterns=...)` against it:

- GET /api/models/<repo>/revision/<rev>   the model info, with `siblings` (size, blobId, lfs)
- GET /api/models/<repo>/tree/<rev>       the file listing snapshot_download asks for
- HEAD, GET /<repo>/resolve/<rev>/<file>  the file, with the hub's headers and Range support

Any 40-hex string is a revision of the repository, except those in `missing_revisions`. Fault
switches, set by a test between runs: `cut` (close the connection at a byte offset of a file for its
next `count` GETs), `flip` (serve one byte of a file flipped), `truncate` (serve the first half of a
file as if it were all of it), `sizes` (advertise another size for a file in the listings),
`missing_revisions`. The listings keep the true hashes and sizes whatever the resolve URLs serve. Every request is
recorded in `requests` as (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_id(data: bytes) -> str:
    """The git object id of a file's bytes: the hub's `blobId` (and ETag) of a file kept outside LFS."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name: str) -> bool:
    return name.endswith(".safetensors") or name.endswith(".bin")


class FakeHub:
    def __init__(self, repo: str, files: dict[str, bytes]):
        self.repo, self.files = repo, dict(files)
        self.cut: dict[str, list[int]] = {}  # name -> [byte offset, GETs left to cut]
        self.flip: set[str] = set()
        self.truncate: set[str] = set()
        self.sizes: dict[str, int] = {}
        self.missing_revisions: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self.cuts_done = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def resolves(self, method: str = "GET", name: str = "") -> list[tuple[str, str, str | None]]:
        """The recorded requests of resolve URLs (of file `name`, if given) with `method`."""
        return [
            r
            for r in self.requests
            if r[0] == method and "/resolve/" in r[1] and (not name or r[1].endswith("/" + name))
        ]

    # What the hub says about a file: the true hashes, and the size unless a test overrides it.
    def etag(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_id(data)

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        size = self.sizes.get(name, len(data))
        entry = {"rfilename": name, "size": size, "blobId": git_blob_id(data)}
        if is_lfs(name):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
        return entry

    def tree_entry(self, name: str) -> dict:
        s = self.sibling(name)
        entry = {"type": "file", "path": name, "size": s["size"], "oid": s["blobId"]}
        if "lfs" in s:
            entry["lfs"] = {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": 134}
        return entry

    def body(self, name: str) -> bytes:
        data = self.files[name]
        if name in self.flip:
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
        if name in self.truncate:
            data = data[: len(data) // 2]
        return data


def _handler(hub: FakeHub):
    repo = re.escape(hub.repo)
    api = re.compile(rf"/api/models/{repo}/(revision|tree)/([^/]+)")
    resolve = re.compile(rf"/{repo}/resolve/([^/]+)/(.+)")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the test reads `hub.requests` instead
            pass

        def do_HEAD(self):
            self.serve(head=True)

        def do_GET(self):
            self.serve(head=False)

        def serve(self, head: bool):
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if m := api.fullmatch(path):
                kind, revision = m.groups()
                if not self.known(revision):
                    return
                if kind == "revision":
                    info = {
                        "id": hub.repo,
                        "modelId": hub.repo,
                        "sha": revision,
                        "private": False,
                        "siblings": [hub.sibling(n) for n in sorted(hub.files)],
                    }
                else:
                    info = [hub.tree_entry(n) for n in sorted(hub.files)]
                return self.reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
            if m := resolve.fullmatch(path):
                revision, name = m.groups()
                if not self.known(revision):
                    return
                if name not in hub.files:
                    return self.reply(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": revision})
                return self.file(revision, name, head)
            self.reply(404, b"", {"X-Error-Code": "RepoNotFound"})

        def known(self, revision: str) -> bool:
            if re.fullmatch(r"[0-9a-f]{40}", revision) and revision not in hub.missing_revisions:
                return True
            self.reply(404, b"", {"X-Error-Code": "RevisionNotFound"})
            return False

        def file(self, revision: str, name: str, head: bool):
            data = hub.body(name)
            size = len(data)
            etag = f'"{hub.etag(name)}"'
            headers = {
                "X-Repo-Commit": revision,
                "ETag": etag,
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if is_lfs(name):
                headers.update({"X-Linked-Etag": etag, "X-Linked-Size": str(size)})
            start, status = 0, 200
            if not head and (m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")):
                start, status = int(m.group(1)), 206
                headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
            body = b"" if head else data[start:]
            if head:
                headers["Content-Length"] = str(size)
            cut = hub.cut.get(name)
            if head or not cut or cut[1] <= 0:
                return self.reply(status, body, headers)
            cut[1] -= 1  # send the headers of the whole answer, then drop the line at the cut offset
            hub.cuts_done += 1
            self.reply(status, body[: max(0, cut[0] - start)], {**headers, "Content-Length": str(len(body))})
            self.close_connection = True

        def reply(self, status: int, body: bytes, headers: dict):
            self.send_response(status)
            headers = {"Content-Length": str(len(body)), **headers}
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

    return Handler
