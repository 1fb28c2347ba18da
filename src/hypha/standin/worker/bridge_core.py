"""One Job Bridge, as a Hypha worker serves it on WORK_DIR/bridge.sock: what each route does.

It follows docs/protocol.md sections 2 and 7, sharp edges included: one receive stream per job,
`send` answered before the copy, pushes written to `<path>/<peer-id>` and announced only
on an open stream, and every file written in place as Rust's `File::create` does
(truncated, then written: the same inode, so a reader that has it open or mapped sees it
change under it). The HTTP face is bridge_http.py, and bridge_server.py serves the two on the
socket; what lies beyond the bridge (scheduler, data, models, peers) is a `BridgeBackend`
(backend.py).

`generation="actions"` plays an action-era worker's bridge instead (docs/protocol-actions.md
section 2): `/action/update` in place of `/status/send`, a send that answers once every
target has the bytes and deletes the file when asked (`remove_file`), and a receive that
waits for one push until its deadline (204 when none came). A deadline already past sets no
timer at all, as upstream's: such a receive waits until the job ends. A push goes to the
first open receive that allows its peer. One that arrives while none is open is refused and
logged, as upstream's worker refuses it (its connector registers the push protocol with
libp2p only while a receive is open, one receive at a time), unless a receive opens within
its sender's tries (`Push.retry_s`); a receive beside an open one is answered 204 at once
(docs/protocol-actions.md: "A push with no receive open"). `strict_receive=False`, kinder,
keeps such a push for the next receive and lets receives open side by side. The backend
hears whether each push was taken or refused (`settle_push`): a peer's send waits for that,
as upstream's fails when the peer refuses it.
"""

from __future__ import annotations

import io
import json
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from hypha.accelerate_executor.errors import ErrorKind
from hypha.accelerate_executor.protocol.actions.messages import SystemTime
from hypha.accelerate_executor.protocol.alpha17.messages import PROGRESS, Progress
from hypha.accelerate_executor.protocol.generation import Generation
from hypha.accelerate_executor.protocol.messages import DEFAULT_RECEIVE_DIR
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


class JobBridge:
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
        generation: Generation = "alpha17",
        job_id: str | None = None,
        strict_receive: bool = True,
    ) -> None:
        """`job_id`: the job an action-era bridge serves; requests for another are refused.
        `strict_receive` (the default): as upstream's worker, an action-era push that no
        open receive takes is refused, and a receive beside an open one is answered 204 at
        once; False keeps such a push for the next receive, kinder than upstream."""
        self.generation: Generation = generation
        self.job_id = job_id
        self.strict_receive = strict_receive
        # The errors its routes answer on demand (faults.py); none unless asked for. Read
        # by the HTTP handler at each request, so a plan set on a serving bridge is played.
        self.faults = FaultPlan()
        # Action era, under _lock: the open receives, each its allowed peers (none: any) and
        # the queue it waits on, oldest first; and the pushes kept for the next receive.
        self._receives: list[tuple[set[str], queue.Queue[Push]]] = []
        self._inbox: list[Push] = []
        self._answered = 0  # receives answered with a file
        self.work_dir = Path(work_dir)
        self.backend = backend
        self.owner = owner if owner is not None and os.geteuid() == 0 else None
        self.keepalive_s = keepalive_s
        self.name = name
        self._real_work_dir = Path(os.path.realpath(self.work_dir))
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Receive state: one stream per job, ever.
        self._stream: queue.Queue[dict[str, Any] | None] | None = None
        self._stream_peers: list[str] = []
        self._receive_dir = DEFAULT_RECEIVE_DIR
        self._stream_ended = threading.Event()
        self._stream_ended.set()
        self._senders: list[threading.Thread] = []

    # Life cycle.

    def start(self) -> None:
        self._poller = threading.Thread(
            target=self._poll_pushes, name=f"{self.name}-pushes", daemon=True
        )
        self._poller.start()

    def end_stream(self) -> None:
        """Stops polling, and lets the receive stream write its last chunk (waiting a
        little for it) before its connection is cut."""
        self._stopping.set()
        with self._lock:
            if self._stream is not None:
                self._stream.put(None)
        self._stream_ended.wait(2.0)

    def join(self) -> None:
        for thread in [self._poller, *self._senders]:
            thread.join(10.0)

    def log(self, text: str) -> None:
        warn(self.name, text)

    # What each route does; the handler parses the request and writes the answer.

    def fetch(self, reference: dict[str, Any], truncated: bool = False) -> list[dict[str, Any]]:
        """`reference`: a Reference as serde decodes it (protocol/alpha17/messages.BODY_REFERENCE).
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

    def send(self, request: dict[str, Any]) -> None:
        """`request`: protocol/alpha17/messages.SEND_REQUEST as serde decodes it."""
        path, relative, targets = self._send_request(request)
        try:
            source = path.open("rb")
        except OSError as exc:
            raise server_error("io_error", f"cannot read {relative}: {exc.strerror}") from None
        sender = threading.Thread(
            target=self._send_in_background, args=(source, relative, targets), daemon=True
        )
        self._senders.append(sender)
        sender.start()

    def open_stream(self, request: dict[str, Any]) -> queue.Queue[dict[str, Any] | None] | None:
        """Registers the job's receive stream; None while one is open.
        `request`: protocol/alpha17/messages.RECEIVE_REQUEST as serde decodes it."""
        resource = request["resource"]
        if resource["type"] != "peers":
            raise invalid_request("receive takes a peers reference")
        if resource["strategy"]["type"] != "All":
            raise invalid_request(f"receive needs strategy All, not {resource['strategy']['type']}")
        directory = self._relative(request.get("path", DEFAULT_RECEIVE_DIR))
        with self._lock:
            # One at a time: upstream's connector frees the registration once the stream is
            # dropped (libp2p-stream's `accept` skips closed senders; docs/faults.md).
            if self._stream is not None or self._stopping.is_set():
                return None
            self._stream = queue.Queue()
            self._stream_peers = list(resource["peers"])
            self._receive_dir = directory.relative_to(self._real_work_dir).as_posix()
            self._stream_ended.clear()
            return self._stream

    def close_stream(self) -> None:
        with self._lock:
            self._stream = None
        self._stream_ended.set()

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        """`request`: an ActionRequest (bridge/actions.ACTION_REQUEST) as JSON."""
        if self.job_id is not None and request.get("job_id") != self.job_id:
            raise invalid_request("the action request is for another job")
        try:
            return self.backend.action(request)
        except BackendError as exc:
            raise server_error("network_error", exc.detail) from None

    def send_now(self, request: dict[str, Any]) -> None:
        """The action-era send: every target gets the bytes before the answer; then the file
        is deleted when `remove_file`. `request`: protocol/actions/messages.ACTION_SEND_REQUEST."""
        path, relative, targets = self._send_request(request)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise server_error("io_error", f"cannot read {relative}: {exc.strerror}") from None
        try:
            for peer in targets:
                self.backend.send(peer, data)
        except BackendError as exc:  # a refusing peer: connector_error, as upstream's
            raise server_error(exc.kind, exc.detail) from None
        if request["remove_file"]:
            path.unlink(missing_ok=True)

    def receive_one(self, request: dict[str, Any], stream_s: float = 0.0) -> dict[str, Any] | None:
        """The action-era receive: the first push from the peers (any, for none named) until
        the deadline, written to `<path>/<peer>`; None when none came (204). `stream_s`: the
        push's bytes take that long to come (a slow link), deadline or not: upstream's bridge
        stops the receive's idle timer once data flows.
        `request`: protocol/actions/messages.ACTION_RECEIVE_REQUEST."""
        resource = request["resource"]
        if resource["type"] != "peers":
            raise invalid_request("receive takes a peers reference")
        if resource["strategy"]["type"] != "All":
            raise invalid_request(f"receive needs strategy All, not {resource['strategy']['type']}")
        directory = self._relative(request.get("path", DEFAULT_RECEIVE_DIR))
        allowed = set(resource["peers"])
        deadline = _deadline_of(request)
        mine: queue.Queue[Push] = queue.Queue()
        with self._lock:
            if self.strict_receive and self._receives:
                self.log("refused a receive: one of the job is open already (strict_receive)")
                return None
            kept, self._inbox = self._inbox, []
            for held in kept:
                self._offer(mine, allowed, held)
            self._receives.append((allowed, mine))
        try:
            push = self._next_push(mine, deadline)
        finally:
            with self._lock:
                self._receives.remove((allowed, mine))
                while not mine.empty():  # came as the receive ended
                    self._unreceived(mine.get())
        if push is None:
            return None
        self._settle(push, taken=True)
        rel = f"{directory.relative_to(self._real_work_dir).as_posix()}/{push.from_peer}"
        produce = partial(_write_slowly, push.data, stream_s) if stream_s else None
        size = self._write(self._relative(rel), produce or partial(_write_bytes, push.data))
        with self._lock:
            self._answered += 1
        return {"path": rel, "size": size, "from_peer": push.from_peer}

    def receives_open(self) -> int:
        """How many action-era receives are waiting now."""
        with self._lock:
            return len(self._receives)

    def pushes_held(self) -> int:
        """How many action-era pushes wait for a receive to open (kept, or within their
        sender's tries)."""
        with self._lock:
            return len(self._inbox)

    def receives_answered(self) -> int:
        """How many action-era receives have been answered with a file so far."""
        with self._lock:
            return self._answered

    def _next_push(self, mine: queue.Queue[Push], deadline: float | None) -> Push | None:
        while not self._stopping.is_set():
            wait = PUSH_POLL_S if deadline is None else min(PUSH_POLL_S, deadline - time.time())
            if wait <= 0:
                return None
            try:
                return mine.get(timeout=wait)
            except queue.Empty:
                continue
        return None

    def _offer(self, mine: queue.Queue[Push], allowed: set[str], push: Push) -> None:
        """A kept push to a receive that has just opened."""
        if allowed and push.from_peer not in allowed:
            self.log(f"dropped a push from {push.from_peer}, which this receive does not allow")
            self._settle(push, taken=False)
        else:
            mine.put(push)

    def _unreceived(self, push: Push) -> None:
        """Under _lock: a push no open receive takes. Strict, as upstream's worker, it is
        refused, unless its pusher goes on trying (a peer's send, `push.retry_s`): then a
        receive that opens that soon gets it."""
        if not self.strict_receive:
            self._inbox.append(push)
            self._settle(push, taken=True)  # kept: the next receive gets it
        elif push.retry_s > 0:
            self._inbox.append(push)
            timer = threading.Timer(push.retry_s, self._retries_over, args=(push,))
            timer.daemon = True
            timer.start()
        else:
            self._refused(push)

    def _retries_over(self, push: Push) -> None:
        with self._lock:
            if any(kept is push for kept in self._inbox):
                self._inbox = [kept for kept in self._inbox if kept is not push]
                self._refused(push, f" within its sender's {push.retry_s:g} s of tries")

    def _refused(self, push: Push, when: str = "") -> None:
        self.log(
            f"dropped a push from {push.from_peer}: no receive of the job was open{when} "
            "(strict_receive)"
        )
        self._settle(push, taken=False)

    def _settle(self, push: Push, taken: bool) -> None:
        """Tells the backend the push's fate, on a thread of its own: this may run under
        _lock, and the pusher may be waiting for it."""

        def tell() -> None:
            try:
                self.backend.settle_push(push.seq, taken)
            except BackendError as exc:
                self.log(f"could not report push {push.seq} {'taken' if taken else 'refused'}: "
                         f"{exc.detail}")  # fmt: skip

        threading.Thread(target=tell, name=f"{self.name}-verdict", daemon=True).start()

    def status(self, progress: Progress) -> dict[str, Any]:
        try:
            return self.backend.status(PROGRESS.dump_python(progress, mode="json"))
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None

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

    # Background work.

    def _send_in_background(self, source: BinaryIO, rel: str, peers: list[str]) -> None:
        try:
            with source:
                data = source.read()
            for peer in peers:
                self.backend.send(peer, data)
        except (OSError, BackendError) as exc:
            # The request was answered already: like the real worker, all we can do is log.
            self.log(f"sending {rel} failed: {exc}")

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
            if self.generation == "actions":
                self._settle(push, taken=False)
            return
        if self.generation == "actions":
            with self._lock:
                for allowed, waiting in self._receives:
                    if not allowed or push.from_peer in allowed:
                        waiting.put(push)
                        return
                self._unreceived(push)
            return
        with self._lock:
            rel = f"{self._receive_dir}/{push.from_peer}"
            # The stream open as the push came: one opened while it is written is told of
            # the pushes after it only.
            stream, peers = self._stream, self._stream_peers

        def produce(out: BinaryIO) -> None:
            out.write(push.data)

        try:
            size = self._write(self._relative(rel), produce)
        except BridgeRefusal as exc:
            self.log(f"could not store the push from {push.from_peer}: {exc.body.decode()}")
            return
        if stream is not None and (not peers or push.from_peer in peers):
            stream.put({"path": rel, "size": size, "from_peer": push.from_peer})


def _write_bytes(data: bytes, out: BinaryIO) -> None:
    out.write(data)


def _first_half(produce: Callable[[BinaryIO], None], out: BinaryIO) -> None:
    """What `produce` writes, cut to its first half: a download that broke off."""
    whole = io.BytesIO()
    produce(whole)
    out.write(whole.getvalue()[: len(whole.getvalue()) // 2])


def _write_slowly(data: bytes, seconds: float, out: BinaryIO) -> None:
    """`data` in ten pieces over `seconds`, each flushed: a file that grows as a slow
    stream's does."""
    piece = -(-len(data) // 10) or 1
    for start in range(0, len(data), piece):
        time.sleep(seconds / 10)
        out.write(data[start : start + piece])
        out.flush()


def _deadline_of(request: dict[str, Any]) -> float | None:
    """A receive's deadline in seconds since the epoch; None for none, and for one already
    past: upstream sets no timer for it."""
    timeout = request.get("timeout")
    if timeout is None:
        return None
    deadline = SystemTime.model_validate(timeout).seconds
    return deadline if deadline >= time.time() else None
