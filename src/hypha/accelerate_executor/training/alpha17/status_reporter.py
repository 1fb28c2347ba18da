"""Talking to the scheduler without stalling the training step (rank 0 only).

StatusReporter sends one `status` per trained batch, carrying that batch's samples, as soon
as the batch is done. The real scheduler takes the time between two statuses as the time of
one batch, and a Hypha worker forwards each status over the network (20-100 ms for an
answer): so each status in flight has a connection of its own (a kept-alive one whose last
answer has been read, or a new one), and none is queued behind another's answer. All of it
runs on the training thread, without waiting: a request is written whole at once (a Unix
socket takes a hundred bytes without blocking), and the step loop reads whichever answers
have arrived; until ScheduleUpdate, alpha.17's loop waits for all but the last status's
before a batch. No sender threads, so nothing competes with the step for the interpreter;
bench/step_overhead.py measures what a status costs a step.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypha.accelerate_executor.bridge.client import (
    REQUEST_TIMEOUT_S,
    REUSE_IDLE_S,
    BridgeClient,
    idle_connection_is_spent,
    json_body,
    raise_for,
    reaching,
)
from hypha.accelerate_executor.bridge.http_wire import (
    Response,
    ResponseReader,
    connect_unix,
    post_request,
)
from hypha.accelerate_executor.bridge.retry import retrying
from hypha.accelerate_executor.errors import BridgeAnswerError, BridgeGoneError
from hypha.accelerate_executor.protocol.alpha17.messages import (
    STATUS_ROUTE,
    SchedulerAnswer,
    batch_status,
    parse_answer,
)
from hypha.accelerate_executor.protocol.messages import wire

# A bridge this far behind is not answering: the next status waits for the oldest answer.
MAX_IN_FLIGHT = 64


@dataclass(frozen=True)
class StatusAnswer:
    answer: SchedulerAnswer
    batch: int  # the job-wide number of the batch whose status it answers
    # The highest batch answered when this answer came, itself included: concurrent statuses
    # may reach the scheduler out of order, and it answers each counting all it has seen.
    seen: int


@dataclass
class _InFlight:
    sock: socket.socket
    batch: int
    deadline: float  # time.monotonic() by which its answer must have come
    reader: ResponseReader
    request: bytes  # sent again after a transient failure


class StatusReporter:
    def __init__(self, bridge: BridgeClient) -> None:
        self._socket_path = bridge.socket_path
        self._idle: list[tuple[socket.socket, float]] = []  # with when it went idle
        self._in_flight: dict[int, _InFlight] = {}  # by file descriptor, in the order sent
        self._poller = select.poll()
        self._answers: list[StatusAnswer] = []
        self._seen = 0
        self._requests: dict[int, bytes] = {}  # by samples
        self._retry_policy = bridge.retry_policy

    def batch_done(self, batch: int, samples: int) -> None:
        """Sends the status of batch number `batch` (1, 2, 3, ... over the job); does not
        wait for its answer. Statuses go out in the order of the calls."""
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            self._read(wait=True, while_at_least=MAX_IN_FLIGHT)
        request = self._requests.get(samples)
        if request is None:  # made once: every batch reports the job's batch size
            request = post_request(STATUS_ROUTE, json_body(wire(batch_status(samples))))
            self._requests[samples] = request
        sock = retrying(STATUS_ROUTE, lambda: self._send(request), self._retry_policy)
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        flight = _InFlight(sock, batch, deadline, ResponseReader(), request)
        self._in_flight[sock.fileno()] = flight
        self._poller.register(sock, select.POLLIN)

    def _send(self, request: bytes) -> socket.socket:
        with reaching(self._socket_path, STATUS_ROUTE, REQUEST_TIMEOUT_S):
            sock, reused = self._connection()
            try:
                sock.sendall(request)
            except ConnectionError:
                sock.close()
                if not reused:
                    raise
                # The bridge closed the idle connection just before the request went out (a
                # Unix socket refuses the write at once), so it never read it: sent again,
                # once, on a new connection.
                sock = connect_unix(self._socket_path, REQUEST_TIMEOUT_S)
                sock.sendall(request)
        return sock

    def answers(self, through: int = 0) -> list[StatusAnswer]:
        """The answers that arrived since the last call: waits for those of the statuses up
        to batch `through`, not for the others."""
        while self._in_flight and next(iter(self._in_flight.values())).batch <= through:
            self._read(wait=True, while_at_least=len(self._in_flight))
        self._read(wait=False)
        return self._take_answers()

    def flush(self) -> list[StatusAnswer]:
        """Waits until every status sent is answered; returns the answers."""
        self._read(wait=True)
        return self._take_answers()

    def close(self) -> None:
        for flight in self._in_flight.values():
            flight.sock.close()
        for sock, _ in self._idle:
            sock.close()
        self._in_flight.clear()
        self._idle.clear()

    def _connection(self) -> tuple[socket.socket, bool]:
        """A recently used connection the bridge has not closed, or a new one; and which it
        is (see BridgeClient._acquire for why only recent ones)."""
        while self._idle:
            sock, idle_since = self._idle.pop()
            if time.monotonic() - idle_since < REUSE_IDLE_S and not idle_connection_is_spent(sock):
                return sock, True
            sock.close()
        return connect_unix(self._socket_path, REQUEST_TIMEOUT_S), False

    def _read(self, wait: bool, while_at_least: int = 1) -> None:
        """Reads the answers that have arrived; with `wait`, goes on waiting for answers as
        long as `while_at_least` statuses or more are in flight. TimeoutError once the
        oldest status in flight has waited REQUEST_TIMEOUT_S."""
        with reaching(self._socket_path, STATUS_ROUTE, REQUEST_TIMEOUT_S):
            while self._in_flight:
                oldest = next(iter(self._in_flight.values())).deadline
                wait_ms = max(0.0, oldest - time.monotonic()) * 1e3 if wait else 0.0
                for fd, _ in self._poller.poll(wait_ms):
                    self._take_readable(self._in_flight[fd])
                if self._in_flight and next(iter(self._in_flight.values())).deadline <= (
                    time.monotonic()
                ):
                    raise TimeoutError
                if not wait or len(self._in_flight) < while_at_least:
                    return

    def _take_readable(self, flight: _InFlight) -> None:
        lost = False
        try:
            response = flight.reader.feed(flight.sock.recv(65536))
        except ValueError as exc:  # not HTTP: whatever is on the socket, it is not the bridge
            raise BridgeAnswerError(STATUS_ROUTE, 0, "bad_http", str(exc)) from None
        except ConnectionError:  # the answer is lost; the status may have gone through
            response, lost = None, True
        if response is None and not lost:
            return
        self._poller.unregister(flight.sock)
        del self._in_flight[flight.sock.fileno()]
        if response is not None and response.keep_alive:
            self._idle.append((flight.sock, time.monotonic()))
        else:
            flight.sock.close()
        if lost or (response is not None and response.status >= 500):
            # A transient failure: the same status again, waiting for its answer, within the
            # bound (bridge/retry.py says why the same one, and what a lost answer costs).
            # Rare, so it may stall the step; the statuses behind it keep their places.
            response = retrying(
                STATUS_ROUTE, self._again(flight.request, response), self._retry_policy
            )
        assert response is not None
        if response.status != 200:
            raise_for(STATUS_ROUTE, response.status, response.body)
        try:
            answer = parse_answer(json.loads(response.body))
        except ValueError:
            raise BridgeAnswerError(STATUS_ROUTE, 200, "bad_answer", "not JSON") from None
        self._seen = max(self._seen, flight.batch)
        self._answers.append(StatusAnswer(answer, flight.batch, self._seen))

    def _again(self, request: bytes, first: Response | None) -> Callable[[], Response]:
        """The tries of a status whose first try failed (`first`: its 5xx answer, None when
        its answer was lost): that failure raised as the first try, so that the next one
        comes after a pause, then `request` sent again."""
        first_pending = [True]  # emptied once the first failure has been raised

        def attempt() -> Response:
            if first_pending:
                first_pending.clear()
                if first is None:
                    raise BridgeGoneError("lost the bridge's answer", transient=True)
                raise_for(STATUS_ROUTE, first.status, first.body)
            return self._exchange(request)

        return attempt

    def _exchange(self, request: bytes) -> Response:
        """`request` on a connection of its own, its whole answer awaited."""
        with reaching(self._socket_path, STATUS_ROUTE, REQUEST_TIMEOUT_S):
            sock = connect_unix(self._socket_path, REQUEST_TIMEOUT_S)
            try:
                sock.sendall(request)
                reader = ResponseReader()
                while (response := reader.feed(sock.recv(65536))) is None:
                    pass
            finally:
                sock.close()
        if response.status >= 500:
            raise_for(STATUS_ROUTE, response.status, response.body)
        return response

    def _take_answers(self) -> list[StatusAnswer]:
        answers, self._answers = self._answers, []
        return answers  # in the order they came
