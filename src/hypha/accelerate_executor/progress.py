"""Talking to the scheduler without stalling the training step (rank 0 only).

StatusReporter sends one `status` per trained batch, carrying that batch's samples, as soon
as the batch is done. The real scheduler takes the time between two statuses as the time of
one batch, and a Hypha worker forwards each status over the network (20-100 ms for an
answer): so statuses go out concurrently, on a few kept-alive connections, never queued
behind each other's answers, and the step loop picks up whichever answers have arrived
without waiting. UpdateInbox holds the job's one receive stream open from start to end
and queues the files the parameter server pushes.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from hypha.accelerate_executor.bridge import BridgeClient, ReceivedFile, SchedulerAnswer
from hypha.accelerate_executor.errors import BridgeGoneError, ExecutorError
from hypha.accelerate_executor.job import PeersReference

# Statuses in flight at once: enough for a 100 ms answer behind steps of 15 ms.
STATUS_SENDERS = 8


@dataclass(frozen=True)
class StatusAnswer:
    answer: SchedulerAnswer
    batch: int  # the job-wide number of the batch whose status it answers
    # The highest batch answered when this answer came, itself included: concurrent statuses
    # may reach the scheduler out of order, and it answers each counting all it has seen.
    seen: int


class StatusReporter:
    def __init__(self, bridge: BridgeClient) -> None:
        self._bridge = bridge
        self._senders = ThreadPoolExecutor(STATUS_SENDERS, thread_name_prefix="hypha-status")
        self._lock = threading.Lock()
        self._in_flight: set[Future[None]] = set()
        self._answers: list[StatusAnswer] = []
        self._failure: ExecutorError | None = None
        self._seen = 0
        self._turn = threading.Condition()
        self._next_to_send = 1  # the batch whose request goes out next

    def batch_done(self, batch: int, samples: int) -> None:
        """Sends the status of batch number `batch` (1, 2, 3, ... over the job) in the
        background."""
        future = self._senders.submit(self._send, batch, samples)
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._forget)

    def answers(self) -> list[StatusAnswer]:
        """The answers that arrived since the last call, without waiting."""
        with self._lock:
            return self._take_answers()

    def flush(self) -> list[StatusAnswer]:
        """Waits until every status sent is answered; returns the answers."""
        with self._lock:
            in_flight = list(self._in_flight)
        wait(in_flight)
        with self._lock:
            return self._take_answers()

    def close(self) -> None:
        self._senders.shutdown(wait=False, cancel_futures=True)

    def _send(self, batch: int, samples: int) -> None:
        """Runs on a sender thread. Requests go out in batch order, each once the previous
        one is written, so the scheduler counts them as they were trained; the answers
        come back in any order."""
        with self._turn:
            self._turn.wait_for(lambda: self._next_to_send == batch)
        sent = False

        def pass_turn() -> None:
            nonlocal sent
            if not sent:
                sent = True
                with self._turn:
                    self._next_to_send += 1
                    self._turn.notify_all()

        try:
            answer = self._bridge.status({"status": {"batch_size": samples}}, on_sent=pass_turn)
        except Exception as exc:  # on a thread: whatever it is, the step loop must learn of it
            failure = (
                exc
                if isinstance(exc, ExecutorError)
                else BridgeGoneError(f"sending a status failed: {type(exc).__name__}: {exc}")
            )
            with self._lock:
                self._failure = self._failure or failure
            return
        finally:
            pass_turn()
        with self._lock:
            self._seen = max(self._seen, batch)
            self._answers.append(StatusAnswer(answer, batch, self._seen))

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def _take_answers(self) -> list[StatusAnswer]:
        if self._failure is not None:
            raise self._failure
        answers, self._answers = self._answers, []
        return answers  # in the order they came


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
