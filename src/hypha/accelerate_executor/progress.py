"""Talking to the scheduler without stalling the training step (rank 0 only).

StatusReporter sends the per-batch `status` messages without waiting for their answers,
which the step loop picks up once they have come, so an answer may be seen a step late.
UpdateInbox holds the job's one receive stream open from start to end and queues the
files the parameter server pushes.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from hypha.accelerate_executor.bridge import BridgeClient, PendingStatus, ReceivedFile
from hypha.accelerate_executor.errors import BridgeGoneError, ExecutorError, SchedulerError
from hypha.accelerate_executor.job import PeersReference

Answer = dict[str, Any]


@dataclass(frozen=True)
class StatusAnswer:
    answer: Answer
    batches_reported: int  # batches trained when the status it answers was sent


class StatusReporter:
    """Sends a `status` after every batch without waiting for its answer: the request goes
    out at once and the answer is read at a later step, once it has come. No thread: one
    would take the interpreter from the step loop every step, to do less than this does.
    While an answer is outstanding, further batches are counted and go out together in the
    next message."""

    def __init__(self, bridge: BridgeClient) -> None:
        self._bridge = bridge
        self._pending: PendingStatus | None = None
        self._pending_batches = 0  # batches trained when the pending status was sent
        self._unreported_samples = 0
        self._batches = 0
        self._answers: list[StatusAnswer] = []

    def batch_done(self, samples: int) -> None:
        self._unreported_samples += samples
        self._batches += 1
        self._advance(wait=False)

    def answers(self) -> list[StatusAnswer]:
        """The answers that came since the last call, without waiting."""
        self._advance(wait=False)
        return self._take_answers()

    def flush(self) -> list[StatusAnswer]:
        """Waits until every batch is reported and answered; returns the answers."""
        while self._pending is not None or self._unreported_samples:
            self._advance(wait=True)
        return self._take_answers()

    def _take_answers(self) -> list[StatusAnswer]:
        answers, self._answers = self._answers, []
        return answers

    def _advance(self, wait: bool) -> None:
        """Reads the pending answer if it has come (or waits for it), then sends what is
        unreported."""
        if self._pending is not None:
            if not wait and not self._pending.ready():
                return
            answer = self._bridge.status_answer(self._pending)
            self._answers.append(StatusAnswer(answer, self._pending_batches))
            self._pending = None
        if self._unreported_samples:
            progress = {"status": {"batch_size": self._unreported_samples}}
            self._pending = self._bridge.start_status(progress)
            self._pending_batches = self._batches
            self._unreported_samples = 0


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
