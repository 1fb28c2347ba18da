"""A Hugging Face Hub stand-in on loopback: the upload API the real `huggingface_hub` client
(2.4, read from its hf_api.py, _commit_api.py and lfs.py) uses to push a model, so that a
test sees the bytes that arrived.

    POST /api/repos/create                             create_repo (409 when it exists)
    POST /api/models/{repo}/preupload/{revision}       upload mode per file: lfs or regular
    POST /{repo}.git/info/lfs/objects/batch            basic transfer: a PUT URL per object
    PUT  /lfs-objects/{oid}                            the blob (checked against its sha256)
    POST /api/models/{repo}/commit/{revision}          the ndjson commit: header, file, lfsFile

Every request but the blob PUT (a presigned URL on the Hub) needs `Authorization: Bearer
TOKEN`; a wrong or missing one is 401 "Invalid credentials in Authorization header", as the
Hub answers. Xet is refused: the batch answers `basic` whatever the client offers, and the
xet-write-token endpoint is 404. huggingface_hub 2.4 chooses xet whenever hf_xet is
installed, without asking the server, so a client of this stand-in sets
HF_HUB_DISABLE_XET=1 (the Hub itself accepts both).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The Hub stores a file with LFS when it is binary or large; the stand-in by name and size.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".msgpack", ".h5")
LFS_MIN_BYTES = 10 * 1024 * 1024
BAD_CREDENTIALS = "Invalid credentials in Authorization header"
_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
_ROUTES = {
    "create": re.compile(r"^/api/repos/create$"),
    "preupload": re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/]+)$"),
    "batch": re.compile(rf"^/{_REPO}\.git/info/lfs/objects/batch$"),
    "commit": re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>[^/]+)$"),
    "blob": re.compile(r"^/lfs-objects/(?P<oid>[0-9a-f]{64})$"),
}


@dataclass
class HubRepo:
    files: dict[str, bytes] = field(default_factory=dict)  # path -> bytes, as committed
    commits: list[str] = field(default_factory=list)  # commit summaries, oldest first
    private: bool = False


class HubStandin:
    """The stand-in's state and server: `with HubStandin(token) as hub:` serves on
    hub.url until the block ends."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 hex -> bytes, PUT but maybe not committed
        self.refused = 0  # requests answered 401
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HubStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # The API, each returning (status, JSON body).

    def create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        repo = f"{body.get('organization')}/{body.get('name')}"
        with self.lock:
            if repo in self.repos:
                return 409, {"error": "You already created this model repo", "url": self._at(repo)}
            self.repos[repo] = HubRepo(private=body.get("visibility") == "private")
        return 200, {"url": self._at(repo), "name": repo}

    def preupload(self, repo: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        files = [
            {
                "path": entry["path"],
                "uploadMode": "lfs" if _is_lfs(entry["path"], entry["size"]) else "regular",
                "shouldIgnore": False,
                "oid": None,
            }
            for entry in body.get("files", [])
        ]
        return 200, {"files": files, "commitOid": "0" * 40}

    def batch(self, repo: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        objects = [
            {
                "oid": entry["oid"],
                "size": entry["size"],
                "authenticated": True,
                "actions": {"upload": {"href": f"{self.url}/lfs-objects/{entry['oid']}"}},
            }
            for entry in body.get("objects", [])
        ]
        return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def blob(self, oid: str, data: bytes) -> tuple[int, dict[str, Any]]:
        if hashlib.sha256(data).hexdigest() != oid:
            return 400, {"error": "the object's bytes do not match its oid"}
        with self.lock:
            self.blobs[oid] = data
        return 200, {}

    def commit(self, repo: str, lines: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        staged: dict[str, bytes] = {}
        summary = ""
        for line in lines:
            key, value = line.get("key"), line.get("value", {})
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file":
                staged[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                blob = self.blobs.get(value["oid"])
                if blob is None:
                    return 422, {"error": f"{value['path']}: LFS object {value['oid']} missing"}
                staged[value["path"]] = blob
            else:
                return 400, {"error": f"unknown commit line {key!r}"}
        digest = hashlib.sha1(summary.encode())
        for path in sorted(staged):
            digest.update(path.encode() + b"\0" + hashlib.sha256(staged[path]).digest())
        oid = digest.hexdigest()
        with self.lock:
            self.repos[repo].files.update(staged)
            self.repos[repo].commits.append(summary)
        return 200, {"commitUrl": f"{self._at(repo)}/commit/{oid}", "commitOid": oid}

    def _at(self, repo: str) -> str:
        return f"{self.url}/{repo}"


def _is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_BYTES


def _handler(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a test's output is its own; the bodies carry a token's traces

        def do_PUT(self) -> None:
            data = self._body()
            match = _ROUTES["blob"].match(self.path.split("?")[0])
            if match is None:
                self._answer(404, {"error": "not found"})
                return
            self._answer(*hub.blob(match["oid"], data))

        def do_POST(self) -> None:
            data = self._body()
            path = self.path.split("?")[0]
            route, match = next(
                ((name, m) for name, pattern in _ROUTES.items() if (m := pattern.match(path))),
                (None, None),
            )
            if route is None or match is None or route == "blob":
                self._answer(404, {"error": "not found"})  # xet-write-token among them
                return
            if self.headers.get("Authorization") != f"Bearer {hub.token}":
                with hub.lock:
                    hub.refused += 1
                self._answer(401, {"error": BAD_CREDENTIALS})
                return
            if route == "create":
                self._answer(*hub.create(json.loads(data)))
                return
            repo = match["repo"]
            if repo not in hub.repos:
                self._answer(
                    404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
                )
            elif route == "preupload":
                self._answer(*hub.preupload(repo, json.loads(data)))
            elif route == "batch":
                self._answer(*hub.batch(repo, json.loads(data)))
            else:
                lines = [json.loads(line) for line in data.splitlines() if line.strip()]
                self._answer(*hub.commit(repo, lines))

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _answer(
            self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
        ) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if status == 401:
                self.send_header("X-Error-Message", BAD_CREDENTIALS)
            self.end_headers()
            self.wfile.write(payload)

    return Handler
