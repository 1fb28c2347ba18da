"""`push-to-hub` out of a container that has no network (docs/worker.md: The trained model).

For the job's life the shim serves WORK_DIR/hub.sock, connectable by the container's uid
only, and tells the executor its path (HYPHA_HUB_SOCKET). At `push-to-hub` the executor
writes the model into the work dir and POSTs {folder, repository, token} to the socket; the
shim uploads the folder from the host with `huggingface_hub` (training/hub_push.py, the
same code a native executor runs: HF_ENDPOINT, HF_HUB_DISABLE_XET and proxies are the
shim's own environment's, and xet uploads work from here when hf_xet is installed) and
answers 200 with the commit's URL, or 502 with the one line that says why. The executor
reports `pushed-to-hub` only on the 200.

The token exists on the host only in this process's memory: it is in no argv, environment,
`docker inspect` or file. The folder is the container's to write, so the shim uploads a
private copy of its regular files (never following a link, which could name a host file
the container cannot read) from a directory only this process's uid can read.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socketserver
import stat
import tempfile
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.errors import PushError
from hypha.accelerate_executor.shim.owner_socket import OwnerOnlySocket
from hypha.accelerate_executor.training.hub_push import PUSH_ROUTE, SOCKET_VARIABLE, push_folder

SOCKET_NAME = "hub.sock"
MAX_REQUEST_BYTES = 64 * 1024  # a folder path, a repository name and a token


class FolderRefused(Exception):
    """The folder the executor named is not one the shim uploads."""


def private_copy(folder: str, work_dir: str, into: Path) -> list[str]:
    """Copies the regular files directly in `folder` (inside `work_dir`) into `into` (which
    must not hold them yet); their names. A link, a subfolder or a path outside the work dir
    is refused or skipped. Also how the shim copies a kept model out (run.py)."""
    root = os.path.realpath(work_dir)
    real = os.path.realpath(folder)
    if os.path.commonpath([root, real]) != root or real == root:
        raise FolderRefused(f"{folder} is not a folder inside the work dir")
    names = []
    directory = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if not entry.is_file(follow_symlinks=False):
                continue  # a Hugging Face model folder is flat; links are not followed
            fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=directory)
            with os.fdopen(fd, "rb") as source, open(into / entry.name, "xb") as target:
                if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                    raise FolderRefused(f"{entry.name} is not a regular file")
                shutil.copyfileobj(source, target, 1 << 20)
            names.append(entry.name)
    finally:
        os.close(directory)
    if not names:
        raise FolderRefused(f"{folder} holds no files")
    return names


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    work_dir: str

    def handle_error(self, request: object, client_address: object) -> None:
        """Silent: an executor gone before its answer is nobody's to fix here."""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.path != PUSH_ROUTE or not 0 < length <= MAX_REQUEST_BYTES:
            self._answer(404, {"error": "the shim's upload socket takes POST /push only"})
            return
        try:
            request: dict[str, Any] = json.loads(self.rfile.read(length))
            folder, repository, token = (
                str(request["folder"]),
                str(request["repository"]),
                str(request["token"]),
            )
        except (ValueError, KeyError, TypeError):
            self._answer(400, {"error": "pushing the model failed: a malformed upload request"})
            return
        self._answer(*upload(folder, repository, token, self.server.work_dir))

    def _answer(self, status: int, body: dict[str, str]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        """Nothing on the shim's output: that is the executor's log."""


def upload(folder: str, repository: str, token: str, work_dir: str) -> tuple[int, dict[str, str]]:
    """The upload from the host: (200, {commit_url}) or (502, {error: one line})."""
    with tempfile.TemporaryDirectory(prefix="hypha-push-") as private:  # mode 0700
        try:
            private_copy(folder, work_dir, Path(private))
            url = push_folder(Path(private), repository, token)
        except (FolderRefused, OSError) as exc:
            line = f"pushing the model to {repository} failed: {exc}"
            return 502, {"error": line.replace(token, "<token>") if token else line}
        except PushError as exc:
            return 502, {"error": str(exc)}
        except ImportError:
            return 502, {
                "error": f"pushing the model to {repository} failed: the shim's host has no "
                "huggingface_hub (install the [shim] extra)"
            }
    return 200, {"commit_url": url}


class HubUpload(OwnerOnlySocket):
    """Serves WORK_DIR/hub.sock from `start()` until `stop()`, connectable by `owner` (the
    container's uid:gid) only."""

    def __init__(self, work_dir: str, owner: tuple[int, int]) -> None:
        socket_path = os.path.join(work_dir, SOCKET_NAME)
        server = _Server(socket_path, _Handler, bind_and_activate=False)
        server.work_dir = work_dir
        super().__init__(socket_path, server, owner, "hub-upload")

    def container_env(self) -> dict[str, str]:
        return {SOCKET_VARIABLE: self.socket_path}
