"""An action-era worker's Job Bridge (docs/protocol-actions.md section 2): the shared bridge
(worker/bridge_core.py) with the action protocol's send, receive and `/action/update`.

A send answers once every target has the bytes and deletes the file when asked
(`remove_file`); a receive waits for one push until its deadline (204 when none came). A
deadline already past sets no timer at all, as upstream's: such a receive waits until the
job ends. A push goes to the first open receive that allows its peer. One that arrives while
none is open is refused and logged, as upstream's worker refuses it (its connector registers
the push protocol with libp2p only while a receive is open, one receive at a time), unless a
receive opens within its sender's tries (`Push.retry_s`); a receive beside an open one is
answered 204 at once (docs/protocol-actions.md: "A push with no receive open").
`strict_receive=False`, kinder, keeps such a push for the next receive and lets receives open
side by side. The backend hears whether each push was taken or refused (`settle_push`): a
peer's send waits for that, as upstream's fails when the peer refuses it.
"""

from __future__ import annotations

import queue
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from hypha.accelerate_executor.protocol.actions.messages import SystemTime
from hypha.accelerate_executor.protocol.messages import DEFAULT_RECEIVE_DIR
from hypha.standin.backend import BridgeBackend, Push
from hypha.standin.errors import BackendError
from hypha.standin.worker.bridge_core import (
    PUSH_POLL_S,
    JobBridge,
    invalid_request,
    server_error,
    write_bytes,
)


class ActionBridge(JobBridge):
    def __init__(
        self,
        work_dir: Path,
        backend: BridgeBackend,
        *,
        job_id: str | None = None,
        strict_receive: bool = True,
        **bridge: Any,
    ) -> None:
        """`job_id`: the job the bridge serves; requests for another are refused.
        `strict_receive` (the default): as upstream's worker, a push that no open receive
        takes is refused, and a receive beside an open one is answered 204 at once; False
        keeps such a push for the next receive, kinder than upstream."""
        super().__init__(work_dir, backend, **bridge)
        self.job_id = job_id
        self.strict_receive = strict_receive
        # Under _lock: the open receives, each its allowed peers (none: any) and the queue it
        # waits on, oldest first; and the pushes kept for the next receive.
        self._receives: list[tuple[set[str], queue.Queue[Push]]] = []
        self._inbox: list[Push] = []
        self._answered = 0  # receives answered with a file

    # Routes.

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        """`request`: an ActionRequest (protocol/actions/messages.ACTION_REQUEST) as JSON."""
        if self.job_id is not None and request.get("job_id") != self.job_id:
            raise invalid_request("the action request is for another job")
        try:
            return self.backend.action(request)
        except BackendError as exc:
            raise server_error("network_error", exc.detail) from None

    def send_now(self, request: dict[str, Any]) -> None:
        """Every target gets the bytes before the answer; then the file is deleted when
        `remove_file`. `request`: protocol/actions/messages.ACTION_SEND_REQUEST."""
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
        """The first push from the peers (any, for none named) until the deadline, written to
        `<path>/<peer>`; None when none came (204). `stream_s`: the push's bytes take that
        long to come (a slow link), deadline or not: upstream's bridge stops the receive's
        idle timer once data flows. `request`: protocol/actions/messages.ACTION_RECEIVE_REQUEST."""
        allowed = set(self._receive_peers(request))
        directory = self._relative(request.get("path", DEFAULT_RECEIVE_DIR))
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
        size = self._write(self._relative(rel), produce or partial(write_bytes, push.data))
        with self._lock:
            self._answered += 1
        return {"path": rel, "size": size, "from_peer": push.from_peer}

    def receives_open(self) -> int:
        """How many receives are waiting now."""
        with self._lock:
            return len(self._receives)

    def pushes_held(self) -> int:
        """How many pushes wait for a receive to open (kept, or within their sender's tries)."""
        with self._lock:
            return len(self._inbox)

    def receives_answered(self) -> int:
        """How many receives have been answered with a file so far."""
        with self._lock:
            return self._answered

    # Pushes.

    def _arrived(self, push: Push) -> None:
        with self._lock:
            for allowed, waiting in self._receives:
                if not allowed or push.from_peer in allowed:
                    waiting.put(push)
                    return
            self._unreceived(push)

    def _unusable(self, push: Push) -> None:
        self._settle(push, taken=False)

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
