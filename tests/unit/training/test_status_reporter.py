"""StatusReporter against real servers on real Unix sockets: an HTTP/1.1 bridge that keeps
connections alive, one that answers in chunks, and bridges that fail in each way a status
can meet. Every failure is one exception, with one line, raised on the training thread."""

from __future__ import annotations

import itertools
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hypha.accelerate_executor.bridge import client as bridge_client
from hypha.accelerate_executor.bridge.client import BridgeClient
from hypha.accelerate_executor.bridge.retry import RetryPolicy
from hypha.accelerate_executor.errors import BridgeError, BridgeGoneError
from hypha.accelerate_executor.protocol.alpha17.messages import Continue, ScheduleUpdate
from hypha.accelerate_executor.training.alpha17 import status_reporter
from hypha.accelerate_executor.training.alpha17.status_reporter import StatusReporter
from unix_http import serving

CONTINUE = b'{"type": "Continue"}'
Script = Callable[[socket.socket, bytes], bool]  # (connection, request) -> keep the connection


def read_request(connection: socket.socket) -> bytes | None:
    """One POST's bytes, or None when the client closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += connection.recv(65536)
    return body


@dataclass
class RawBridge:
    """A scripted bridge on a Unix socket (each connection runs the script on every request
    it reads), and what it saw: its connections, and the request bodies in order."""

    path: Path
    connections: int = 0
    bodies: list[dict[str, object]] = field(default_factory=list)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transient failures are still tried again, over a bound of a fraction of a second."""
    monkeypatch.setattr(bridge_client, "DEFAULT_POLICY", RetryPolicy(0.01, 0.05, 0.3))


@pytest.fixture
def raw_bridge(short_tmp: Path) -> Iterator[Callable[[Script], RawBridge]]:
    with ExitStack() as servers:

        def start(script: Script) -> RawBridge:
            bridge = RawBridge(short_tmp / f"bridge-{next(numbers)}.sock")

            class Handler(socketserver.BaseRequestHandler):
                def handle(self) -> None:
                    bridge.connections += 1
                    while (body := read_request(self.request)) is not None:
                        bridge.bodies.append(json.loads(body))
                        if not script(self.request, body):
                            return

            servers.enter_context(serving(bridge.path, Handler))
            return bridge

        numbers = itertools.count()
        yield start


def reporter_for(bridge: RawBridge) -> StatusReporter:
    return StatusReporter(BridgeClient(bridge.path, bridge.path.parent))


def answer_with(head: bytes, body: bytes, keep: bool = True) -> Script:
    def script(connection: socket.socket, request: bytes) -> bool:
        connection.sendall(head + body)
        return keep

    return script


def test_statuses_share_kept_alive_connections_and_go_out_in_order(raw_bridge) -> None:
    bridge = raw_bridge(answer_with(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", CONTINUE))
    reporter = reporter_for(bridge)
    answered = []
    for batch in range(1, 21):
        reporter.batch_done(batch, samples=batch)
        answered += reporter.flush()
    reporter.close()
    assert [(a.batch, a.seen, a.answer) for a in answered] == [
        (b, b, Continue()) for b in range(1, 21)
    ]
    assert bridge.bodies == [{"status": {"batch_size": b}} for b in range(1, 21)]
    assert bridge.connections == 1


def test_chunked_answers_are_read(raw_bridge) -> None:
    body = b'{"type": "ScheduleUpdate", "counter": 3}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    bridge = raw_bridge(
        answer_with(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunked)
    )
    reporter = reporter_for(bridge)
    reporter.batch_done(1, 8)
    reporter.batch_done(2, 8)
    assert [a.answer for a in reporter.flush()] == [ScheduleUpdate(3)] * 2


def test_answers_are_picked_up_without_waiting(raw_bridge) -> None:
    answer = threading.Event()

    def late(connection: socket.socket, request: bytes) -> bool:
        answer.wait(10)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + CONTINUE)
        return True

    reporter = reporter_for(raw_bridge(late))
    reporter.batch_done(1, 8)
    started = time.monotonic()
    assert reporter.answers() == []
    assert time.monotonic() - started < 1  # no wait for an answer that has not come
    answer.set()
    [answered] = reporter.flush()
    assert (answered.batch, answered.answer) == (1, Continue())


def test_a_bridge_that_hangs_up_without_answering(raw_bridge) -> None:
    reporter = reporter_for(raw_bridge(lambda connection, request: False))
    reporter.batch_done(1, 8)
    with pytest.raises(BridgeGoneError, match="lost the bridge during /status/send"):
        reporter.flush()


def test_a_bridge_that_hangs_up_in_mid_answer(raw_bridge) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n"
    reporter = reporter_for(raw_bridge(answer_with(head, CONTINUE[:5], keep=False)))
    reporter.batch_done(1, 8)
    with pytest.raises(BridgeGoneError, match="in mid-answer"):
        reporter.flush()


def test_a_bridge_that_never_answers(raw_bridge, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_reporter, "REQUEST_TIMEOUT_S", 0.5)
    reporter = reporter_for(raw_bridge(lambda connection, request: time.sleep(30) or True))
    reporter.batch_done(1, 8)
    started = time.monotonic()
    with pytest.raises(BridgeGoneError, match="did not answer /status/send within"):
        reporter.flush()
    assert time.monotonic() - started < 5


def test_a_bridge_that_speaks_no_http(raw_bridge) -> None:
    reporter = reporter_for(raw_bridge(answer_with(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b"")))
    reporter.batch_done(1, 8)
    with pytest.raises(BridgeError, match="bad_http"):
        reporter.flush()


def test_a_refused_status_is_the_bridges_own_error(raw_bridge) -> None:
    refusal = b'{"error": "bad_request", "detail": "no job"}'
    head = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(refusal)
    reporter = reporter_for(raw_bridge(answer_with(head, refusal)))
    reporter.batch_done(1, 8)
    with pytest.raises(BridgeError, match="400 bad_request: no job"):
        reporter.flush()


def test_an_answer_that_is_not_json(raw_bridge) -> None:
    reporter = reporter_for(
        raw_bridge(answer_with(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", b"{{{"))
    )
    reporter.batch_done(1, 8)
    with pytest.raises(BridgeError, match="bad_answer"):
        reporter.flush()


def test_no_bridge_at_all(short_tmp: Path) -> None:
    reporter = StatusReporter(BridgeClient(short_tmp / "absent.sock", short_tmp))
    with pytest.raises(BridgeGoneError, match="does not exist"):
        reporter.batch_done(1, 8)


def test_a_kept_alive_connection_the_bridge_closed_is_replaced(raw_bridge) -> None:
    """An HTTP/1.1 answer that promises nothing about closing, then a close: the next status
    goes out on a new connection, and each status reaches the bridge once."""
    bridge = raw_bridge(
        answer_with(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", CONTINUE, keep=False)
    )
    reporter = reporter_for(bridge)
    for batch in range(1, 4):
        reporter.batch_done(batch, 8)
        assert [a.batch for a in reporter.flush()] == [batch]
        time.sleep(0.1)  # the close reaches the client while the connection idles
    assert bridge.connections == 3 and len(bridge.bodies) == 3
