"""One Job Bridge, as a Hypha worker serves it on WORK_DIR/bridge.sock: what both
generations' bridges do alike.

It follows docs/protocol.md sections 2 and 7, sharp edges included: a fetch's files and every
push written in place as Rust's `File::create` does (truncated, then written: the same inode,
so a reader that has it open or mapped sees it change under it), nothing outside the work
dir, and the peers' pushes polled from the backend. What a generation adds (its send and
receive, its status or action route) is a subclass: alpha17/bridge.py, actions/bridge.py.
The HTTP face is bridge_http.py (and each generation's routes beside its bridge), and
bridge_server.py serves the two on the socket; what lies beyond the bridge (scheduler, data,
models, peers) is a `BridgeBackend` (backend.py).
"""

from __future__ import annotations

import io
import json
import os
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from hypha.accelerate_executor.errors import ErrorKind
from hypha.standin.backend import BridgeBackend, Push
from hypha.standin.console import warn
from hypha.standin.errors import BackendError, BridgeRefusal
from hypha.standin.worker.faults import FaultPlan

# How long one poll for pushes waits; bounds how long stop() waits for the poller.
PUSH_POLL_S = 0.2


def invalid_request(detail: str) -> BridgeRefusal:
    return BridgeRefusal(
        400, json.dumps({"error": "invalid_request", "detail": detail}), "application/json"
    )


def server_error(kind: ErrorKind, detail: str) -> BridgeRefusal:
    return BridgeRefusal(500, json.dumps({"error": kind, "detail": detail}), "application/json")


class JobBridge(ABC):
    """What one job's bridge does, whatever carries its requests; pushes are polled from
    `start()` until `end_stream()`.

    `owner=(uid, gid)`: when running as root, the socket and everything the bridge writes
    are chowned to it, as if a worker running as that user had made them.
    """

    def __init__(
        self,
        work_dir: Path,
        backend: BridgeBackend,
        *,
        owner: tuple[int, int] | None = None,
        keepalive_s: float = 5.0,
        name: str = "bridge",
    ) -> None:
        # The errors its routes answer on demand (faults.py); none unless asked for. Read
        # by the HTTP handler at each request, so a plan set on a serving bridge is played.
        self.faults = FaultPlan()
        self.work_dir = Path(work_dir)
        self.backend = backend
        self.owner = owner if owner is not None and os.geteuid() == 0 else None
        self.keepalive_s = keepalive_s
        self.name = name
        self._real_work_dir = Path(os.path.realpath(self.work_dir))
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    # What a generation adds.

    @abstractmethod
    def _arrived(self, push: Push) -> None:
        """A peer's push, from a usable peer id: stored, announced or handed to a receive."""

    @abstractmethod
    def _unusable(self, push: Push) -> None:
        """A push from a peer id that cannot name a file, dropped (logged already)."""

    # Life cycle.

    def start(self) -> None:
        self._poller = threading.Thread(
            target=self._poll_pushes, name=f"{self.name}-pushes", daemon=True
        )
        self._poller.start()

    def end_stream(self) -> None:
        """Stops polling for pushes, and lets waiting requests end."""
        self._stopping.set()

    def join(self) -> None:
        self._poller.join(10.0)

    def log(self, text: str) -> None:
        warn(self.name, text)

    # The routes both generations serve alike; the handler parses the request and writes
    # the answer.

    def fetch(self, reference: dict[str, Any], truncated: bool = False) -> list[dict[str, Any]]:
        """`reference`: a Reference as serde decodes it (the handler's `fetch_reference`).
        `truncated`: each file cut to its first half, as a download that broke off leaves
        it in upstream's cache, which hands it out unchecked."""
        kind = reference["type"]
        if kind == "peers":
            raise invalid_request(
                "fetch takes a uri, huggingface or scheduler reference, not peers"
            )
        if kind == "uri":
            url = urlsplit(reference["value"])
            if url.scheme not in ("http", "https"):
                raise invalid_request("uri references must be http:// or https:// URLs")
            if url.path.rsplit("/", 1)[-1] in ("", ".", ".."):
                raise invalid_request("the URL has no file name in its last path segment")
        if kind == "huggingface":
            if not reference["repository"]:
                raise invalid_request("huggingface reference has an empty repository")
            if not reference["filenames"]:
                raise invalid_request("huggingface reference has no filenames")
            for filename in reference["filenames"]:
                self._relative(filename)
        try:
            files = self.backend.fetch(reference)
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None
        fetched = []
        for remote in files:
            target = self._relative(f"artifacts/{remote.name}")
            produce = partial(self.backend.download, remote.blob)
            size = self._write(target, partial(_first_half, produce) if truncated else produce)
            fetched.append(
                {"path": target.relative_to(self._real_work_dir).as_posix(), "size": size}
            )
        return fetched

    def _send_request(self, request: dict[str, Any]) -> tuple[Path, str, list[str]]:
        """A send's file (checked to be in the work dir), its path as given, and the peers
        its strategy picks: all, the first, or one at random. Both generations' sends."""
        resource, relative = request["resource"], request["path"]
        if resource["type"] != "peers":
            raise invalid_request("send takes a peers reference")
        peers, strategy = resource["peers"], resource["strategy"]["type"]
        if not peers:
            raise invalid_request("send needs at least one peer")
        path = self._relative(relative)
        if strategy == "All":
            targets = list(peers)
        elif strategy == "One":
            targets = peers[:1]
        else:
            targets = [random.choice(peers)]
        return path, relative, targets

    @staticmethod
    def _receive_peers(request: dict[str, Any]) -> list[str]:
        """A receive's peers, checked as both generations check them."""
        resource = request["resource"]
        if resource["type"] != "peers":
            raise invalid_request("receive takes a peers reference")
        if resource["strategy"]["type"] != "All":
            raise invalid_request(f"receive needs strategy All, not {resource['strategy']['type']}")
        return list(resource["peers"])

    # Paths and files.

    def _relative(self, rel: str) -> Path:
        """The real path of `rel` under the work dir, or a 400 naming why it is refused."""
        if not rel:
            raise invalid_request("path is empty")
        pure = PurePosixPath(rel)
        if pure.is_absolute():
            raise invalid_request(f"path {rel!r} is absolute; paths are relative to the work dir")
        if ".." in pure.parts:
            raise invalid_request(f"path {rel!r} has a '..' component")
        real = Path(os.path.realpath(self._real_work_dir / pure))
        if real != self._real_work_dir and not real.is_relative_to(self._real_work_dir):
            raise invalid_request(f"path {rel!r} leads out of the work dir through a symlink")
        return real

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner)

    def _make_dirs(self, directory: Path) -> None:
        missing = []
        while not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for path in reversed(missing):
            path.mkdir(exist_ok=True)
            self._own(path)

    def _write(self, target: Path, produce: Callable[[BinaryIO], None]) -> int:
        """Writes a file in place, 0600 (owned by `owner`), as File::create does; its size."""
        try:
            self._make_dirs(target.parent)
            # The directory may have been swapped for a symlink since the path was checked.
            parent = Path(os.path.realpath(target.parent))
            if not parent.is_relative_to(self._real_work_dir):
                raise invalid_request(
                    f"{target.parent} leads out of the work dir through a symlink"
                )
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(parent / target.name, flags, 0o600)
            with os.fdopen(fd, "wb") as out:
                os.fchmod(fd, 0o600)
                if self.owner is not None:
                    os.fchown(fd, *self.owner)
                produce(out)
                return out.tell()
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None
        except OSError as exc:
            raise server_error(
                "io_error", f"cannot write {target.name}: {exc.strerror or exc}"
            ) from None

    # Pushes.

    def _poll_pushes(self) -> None:
        seq = 0
        failing = False
        while not self._stopping.is_set():
            try:
                push = self.backend.next_push(seq, wait_s=PUSH_POLL_S)
            except BackendError as exc:
                if not failing:
                    self.log(f"cannot reach the peers: {exc.detail}; retrying")
                failing = True
                self._stopping.wait(1.0)
                continue
            failing = False
            if push is not None:
                seq = push.seq
                self._deliver(push)

    def _deliver(self, push: Push) -> None:
        if push.from_peer in ("", ".", "..") or "/" in push.from_peer:
            self.log(f"dropped a push from an unusable peer id {push.from_peer!r}")
            self._unusable(push)
            return
        self._arrived(push)


def write_bytes(data: bytes, out: BinaryIO) -> None:
    out.write(data)


def _first_half(produce: Callable[[BinaryIO], None], out: BinaryIO) -> None:
    """What `produce` writes, cut to its first half: a download that broke off."""
    whole = io.BytesIO()
    produce(whole)
    out.write(whole.getvalue()[: len(whole.getvalue()) // 2])
