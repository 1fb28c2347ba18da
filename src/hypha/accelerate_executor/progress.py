"""Talking to the scheduler without stalling the training step (rank 0 only).

StatusReporter sends the per-batch `status` messages from a background thread; the
step loop picks up the answers whenever they have arrived, so an answer may be seen a
step late. UpdateInbox holds the job's one receive stream open from start to end and
queues the files the parameter server pushes.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from hypha.accelerate_executor.bridge import BridgeClient, ReceivedFile
from hypha.accelerate_executor.errors import BridgeGoneError, ExecutorError, SchedulerError
from hypha.accelerate_executor.job import PeersReference

Answer = dict[str, Any]


@dataclass(frozen=True)
class StatusAnswer:
    answer: Answer
    batches_reported: int  # batches trained when the status it answers was sent


class StatusReporter:
    def __init__(self, bridge: BridgeClient) -> None:
        self._bridge = bridge
        self._lock = threading.Condition()
        self._unreported_samples = 0
        self._batches = 0
        self._in_flight = False
        self._answers: list[StatusAnswer] = []
        self._failure: ExecutorError | None = None
        self._closed = False
        threading.Thread(target=self._send_loop, name="hypha-status", daemon=True).start()

    def batch_done(self, samples: int) -> None:
        with self._lock:
            self._unreported_samples += samples
            self._batches += 1
            self._lock.notify_all()

    def answers(self) -> list[StatusAnswer]:
        """The answers that arrived since the last call, without waiting."""
        with self._lock:
            return self._take_answers()

    def flush(self) -> list[StatusAnswer]:
        """Waits until every batch is reported and answered; returns the answers."""
        with self._lock:
            self._lock.wait_for(
                lambda: (
                    self._failure is not None
                    or (not self._in_flight and self._unreported_samples == 0)
                )
            )
            return self._take_answers()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _take_answers(self) -> list[StatusAnswer]:
        if self._failure is not None:
            raise self._failure
        answers, self._answers = self._answers, []
        return answers

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._closed or self._unreported_samples > 0)
                if self._closed:
                    return
                # When the bridge is slower than a step, pending batches go out as one message.
                samples, self._unreported_samples = self._unreported_samples, 0
                batches = self._batches
                self._in_flight = True
            try:
                answer = self._bridge.status({"status": {"batch_size": samples}})
            except ExecutorError as exc:
                with self._lock:
                    self._failure, self._in_flight = exc, False
                    self._lock.notify_all()
                return
            with self._lock:
                self._answers.append(StatusAnswer(answer, batches))
                self._in_flight = False
                self._lock.notify_all()


def expect(answer: Answer, *allowed: str, sent: str) -> str:
    """The answer's type, if it is one of `allowed`; SchedulerError otherwise."""
    kind = str(answer.get("type"))
    if kind not in allowed:
        raise SchedulerError(
            f"the scheduler answered {kind!r} to {sent!r}; expected {' or '.join(allowed)}"
        )
    return kind


class UpdateInbox:
    def __init__(self, bridge: BridgeClient, results: PeersReference) -> None:
        self._accepted_peers = set(results.peers)  # empty: any peer
        self._files: queue.SimpleQueue[ReceivedFile | ExecutorError] = queue.SimpleQueue()
        self._stream = bridge.receive(results)
        threading.Thread(target=self._read_loop, name="hypha-receive", daemon=True).start()

    def next_update(self) -> ReceivedFile:
        """Blocks until the parameter server pushes a file; BridgeGoneError if the stream ends."""
        while True:
            try:
                item = self._files.get(timeout=1.0)  # wake up now and then so SIGTERM is seen
                break
            except queue.Empty:
                continue
        if isinstance(item, ExecutorError):
            raise item
        return item

    def _read_loop(self) -> None:
        try:
            for received in self._stream:
                if not self._accepted_peers or received.from_peer in self._accepted_peers:
                    self._files.put(received)
        except ExecutorError as exc:
            self._files.put(exc)
        except Exception as exc:  # a malformed event must still wake the waiting loop
            self._files.put(BridgeGoneError(f"the update stream broke: {exc}"))
