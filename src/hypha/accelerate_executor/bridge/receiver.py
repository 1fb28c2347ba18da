"""A receive kept open for the whole job, both generations' (alpha.17's one update stream, the
action protocol's receive from the parameter servers): on a daemon thread, one receive after
the other, each file it brings queued for `take` (moved aside first, where the next push
could overwrite it).

Why kept open: upstream's worker refuses a push that comes while no receive is registered
(libp2p-stream offers only registered protocols; docs/faults.md), and a parameter server
pushes when it has aggregated, which may be while we still train.

One reopen rule. A receive that ends (its deadline passed, its file came) is followed by the
next at once. One that fails while the bridge's socket is still there (reset, refused,
silent past the keepalive) is opened again after the retry policy's pause for the failures
in a row (bridge/retry.py), for as long as it takes: whoever waits decides when a failure
has lasted too long (`take`). The socket gone means the worker stopped the job: the loop
ends, and `take` raises why once the files before it are taken. Daemon: a job that ends
while it waits leaves without joining it (entry.exit_without_teardown).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from hypha.accelerate_executor.bridge.client import ReceivedFile
from hypha.accelerate_executor.bridge.retry import RetryPolicy
from hypha.accelerate_executor.errors import BridgeError, BridgeGoneError

# How long the receive may take to put its request on the bridge's socket (`wait_open`).
SENT_WAIT_S = 10.0
# A request on the socket that no refusal has answered within this long counts as
# registered: a bridge that cannot register a receive says so at once.
REGISTERED_AFTER_S = 0.05

# One receive: given an event to set once its request is on the bridge's socket, the files
# it brings (none when its deadline passed empty), raising BridgeError or BridgeGoneError
# when it failed.
OpenReceive = Callable[[threading.Event], Iterable[ReceivedFile]]


class KeptOpenReceiver:
    def __init__(
        self,
        open_receive: OpenReceive,
        socket_path: Path,
        policy: RetryPolicy,
        accept: Callable[[ReceivedFile], bool] = lambda received: True,
        move_aside: bool = True,
        name: str = "hypha-receive",
    ) -> None:
        """`accept`: whether a file that came is one the job wants (others are dropped).
        `move_aside`: whether each file is renamed before it is queued, since the bridge
        writes the next push from the same peer to the same path; False where the next push
        cannot come before this file is used (and the file is then the caller's to keep)."""
        self._open = open_receive
        self._socket_path = socket_path
        self._policy = policy
        self._accept = accept
        self._move_aside = move_aside
        self._files: queue.Queue[ReceivedFile] = queue.Queue()
        self._ended: Exception | None = None  # what ended the loop (the bridge gone, ...)
        # Since a receive last opened or ended well: the failures in a row, the last of
        # them and when they began (time.monotonic()).
        self._failures = 0
        self._failed: BridgeError | None = None
        self._first_failure: BridgeError | None = None
        self._failing_since = 0.0
        self._sent = threading.Event()
        self._thread = threading.Thread(target=self._keep_open, name=name, daemon=True)
        self._thread.start()

    def wait_open(self) -> None:
        """Back once a receive is registered: its request on the bridge's socket and not
        refused at once (REGISTERED_AFTER_S). The caller sends next what makes the push
        come, and a thread not yet scheduled (seen on a loaded machine), or a receive the
        bridge refused, had nothing open when the push came. Bounded: a bridge that never
        takes the request leaves `take` waiting until its deadline."""
        give_up = time.monotonic() + SENT_WAIT_S
        while self._thread.is_alive() and time.monotonic() < give_up:
            if self._sent.wait(0.05):
                time.sleep(REGISTERED_AFTER_S)
                if self._sent.is_set():
                    return

    def take(self, deadline: float | None = None) -> ReceivedFile | None:
        """The oldest file received and not yet taken, waiting for one until `deadline`
        (seconds since the epoch): None when none came, or the last failure when receives
        failed since. With no deadline, waits for a file for as long as receives open; the
        last failure once they have failed for longer than the retry policy's span. Once
        the loop has ended, what ended it is raised when no file is left."""
        while True:
            wait_s = 1.0 if deadline is None else min(0.5, max(0.0, deadline - time.time()))
            try:
                return self._files.get(timeout=wait_s)
            except queue.Empty:
                pass
            if self._ended is not None and self._files.empty():
                raise self._ended from None
            failed = self._failed
            if deadline is not None and time.time() >= deadline:
                if failed is not None:
                    raise failed from None
                return None
            failing_s = time.monotonic() - self._failing_since
            if deadline is None and failed is not None and failing_s > self._policy.total_s:
                raise BridgeGoneError(
                    f"{failed} (the receive opened again {self._failures} times over "
                    f"{failing_s:.0f} s)"
                ) from None

    def holds_file(self) -> bool:
        """A file has come that is not taken yet."""
        return not self._files.empty()

    def _keep_open(self) -> None:
        taken = 0
        try:
            while True:
                try:
                    for received in self._open(self._sent):
                        self._failures, self._failed = 0, None
                        if not self._accept(received):
                            continue
                        if self._move_aside:
                            taken += 1
                            aside = received.path.with_name(f"{received.path.name}.{taken}")
                            received.path.rename(aside)
                            received = replace(received, path=aside)
                        self._files.put(received)
                except BridgeError as exc:
                    self._sent.clear()
                    if not self._socket_path.exists():
                        # The worker stopped the job: what ended the receives is the break
                        # that began the failures, not a reopen's missing socket.
                        first = self._first_failure if self._failures else None
                        raise (first or exc) from None
                    if not self._failures:
                        self._failing_since, self._first_failure = time.monotonic(), exc
                    self._failures += 1
                    self._failed = exc
                    time.sleep(self._policy.pause(self._failures))
                    continue
                self._sent.clear()  # ended well: the next one opens now
                self._failures, self._failed = 0, None
        except Exception as exc:  # raised again by `take` once the files before it are taken
            self._ended = exc
