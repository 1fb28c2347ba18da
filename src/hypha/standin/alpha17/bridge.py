"""alpha.17's Job Bridge (docs/protocol.md sections 2 and 7): the shared bridge
(worker/bridge_core.py) with alpha.17's send, receive stream and status.

One receive stream per job, ever; `send` answered before the copy; pushes written to
`<path>/<peer-id>` and announced only on an open stream.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any, BinaryIO

from hypha.accelerate_executor.protocol.alpha17.messages import PROGRESS, Progress
from hypha.accelerate_executor.protocol.messages import DEFAULT_RECEIVE_DIR
from hypha.standin.backend import BridgeBackend, Push
from hypha.standin.errors import BackendError, BridgeRefusal
from hypha.standin.worker.bridge_core import JobBridge, server_error, write_bytes


class Alpha17Bridge(JobBridge):
    def __init__(self, work_dir: Path, backend: BridgeBackend, **bridge: Any) -> None:
        super().__init__(work_dir, backend, **bridge)
        # Receive state, under _lock: one stream per job, ever.
        self._stream: queue.Queue[dict[str, Any] | None] | None = None
        self._stream_peers: list[str] = []
        self._receive_dir = DEFAULT_RECEIVE_DIR
        self._stream_ended = threading.Event()
        self._stream_ended.set()
        self._senders: list[threading.Thread] = []

    def end_stream(self) -> None:
        """Stops polling, and lets the receive stream write its last chunk (waiting a
        little for it) before its connection is cut."""
        super().end_stream()
        with self._lock:
            if self._stream is not None:
                self._stream.put(None)
        self._stream_ended.wait(2.0)

    def join(self) -> None:
        super().join()
        for thread in self._senders:
            thread.join(10.0)

    # Routes.

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
        peers = self._receive_peers(request)
        directory = self._relative(request.get("path", DEFAULT_RECEIVE_DIR))
        with self._lock:
            # One at a time: upstream's connector frees the registration once the stream is
            # dropped (libp2p-stream's `accept` skips closed senders; docs/faults.md).
            if self._stream is not None or self._stopping.is_set():
                return None
            self._stream = queue.Queue()
            self._stream_peers = peers
            self._receive_dir = directory.relative_to(self._real_work_dir).as_posix()
            self._stream_ended.clear()
            return self._stream

    def close_stream(self) -> None:
        with self._lock:
            self._stream = None
        self._stream_ended.set()

    def status(self, progress: Progress) -> dict[str, Any]:
        try:
            return self.backend.status(PROGRESS.dump_python(progress, mode="json"))
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None

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

    def _unusable(self, push: Push) -> None:
        pass  # alpha.17's pusher hears nothing of its push's fate

    def _arrived(self, push: Push) -> None:
        with self._lock:
            rel = f"{self._receive_dir}/{push.from_peer}"
            # The stream open as the push came: one opened while it is written is told of
            # the pushes after it only.
            stream, peers = self._stream, self._stream_peers
        try:
            size = self._write(self._relative(rel), lambda out: write_bytes(push.data, out))
        except BridgeRefusal as exc:
            self.log(f"could not store the push from {push.from_peer}: {exc.body.decode()}")
            return
        if stream is not None and (not peers or push.from_peer in peers):
            stream.put({"path": rel, "size": size, "from_peer": push.from_peer})
