"""The bridge client against a real HTTP server on a real Unix socket, including a hostile one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from hypha.accelerate_executor.bridge import client as bridge
from hypha.accelerate_executor.bridge.retry import RetryPolicy
from hypha.accelerate_executor.errors import BridgeError, BridgeGoneError, UnsafePathError
from hypha.accelerate_executor.protocol.alpha17.job import PeersReference
from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    batch_status,
    round_metrics,
)
from hypha.accelerate_executor.protocol.job import SchedulerReference
from hypha.accelerate_executor.training.alpha17.bridge import Alpha17Bridge
from repo_paths import TESTS
from unix_http import QuietHandler, serving

PS_PEER = "12D3KooWJ6MBkbH3o7j2yhhDAF7gRxA4Zm5cpuEUr2Znp1VvNBw3"

Reply = tuple[int, str, bytes]  # status, content type, body
PEERS = PeersReference.model_validate({"type": "peers", "peers": [], "strategy": {"type": "All"}})
SLICE = SchedulerReference(type="scheduler", peer="12D3KooWsched", dataset="d")
CAUSAL_LM = TESTS / "data" / "job-causal-lm.json"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transient failures are still tried again, over a bound of a fraction of a second."""
    monkeypatch.setattr(bridge, "DEFAULT_POLICY", RetryPolicy(0.01, 0.05, 0.3))


@pytest.fixture
def serve_unix(tmp_path: Path) -> Iterator[Callable[[type[BaseHTTPRequestHandler]], Path]]:
    """Serves a handler class on a real Unix socket in tmp_path until the test ends."""
    with ExitStack() as servers:
        yield lambda handler: servers.enter_context(serving(tmp_path / "bridge.sock", handler))


@pytest.fixture
def scripted_bridge(
    serve_unix: Callable[[type[BaseHTTPRequestHandler]], Path],
) -> Callable[[Callable[[str, bytes], Reply]], Path]:
    """A bridge whose answers a test scripts: answer(route, body) -> (status, type, body)."""

    def start(answer: Callable[[str, bytes], Reply]) -> Path:
        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.reply(*answer(self.path, body))

        return serve_unix(Handler)

    return start


@dataclass
class Seen:
    connections: int = 0
    requests: int = 0


@pytest.fixture
def kept_alive_bridge(
    serve_unix: Callable[[type[BaseHTTPRequestHandler]], Path],
) -> Callable[[bool], tuple[Path, Seen]]:
    """An HTTP/1.1 bridge answering every status with Continue, counting connections and
    requests; with hang_up it closes each connection after its answer without saying so."""

    def start(hang_up: bool) -> tuple[Path, Seen]:
        seen = Seen()

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                seen.connections += 1

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.requests += 1
                self.reply(200, "application/json", b'{"type": "Continue"}')
                self.close_connection = hang_up

        return serve_unix(Handler), seen

    return start


def test_requests_share_one_kept_alive_connection(kept_alive_bridge, tmp_path: Path) -> None:
    socket_path, seen = kept_alive_bridge(False)
    client = Alpha17Bridge(socket_path, tmp_path)
    answers = [client.status(batch_status(8)) for _ in range(5)]
    assert answers == [Continue()] * 5
    assert (seen.connections, seen.requests) == (1, 5)


def test_a_connection_the_bridge_closed_is_replaced_and_nothing_is_sent_twice(
    kept_alive_bridge, tmp_path: Path
) -> None:
    socket_path, seen = kept_alive_bridge(True)
    client = Alpha17Bridge(socket_path, tmp_path)
    for sent in range(1, 6):
        assert client.status(batch_status(8)) == Continue()
        assert seen.requests == sent
        time.sleep(0.2)  # the bridge's close reaches the client while the connection idles
    assert seen.connections == 5


def test_a_connection_idle_for_long_is_not_reused(
    kept_alive_bridge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket_path, seen = kept_alive_bridge(False)
    monkeypatch.setattr(bridge, "REUSE_IDLE_S", 0.1)
    client = Alpha17Bridge(socket_path, tmp_path)
    client.status(batch_status(8))
    client.status(batch_status(8))
    time.sleep(0.3)
    client.status(batch_status(8))
    assert (seen.connections, seen.requests) == (2, 3)


def json_reply(value: object, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(value).encode()


@pytest.mark.parametrize(
    "hostile", ["/etc/passwd", "../../etc/passwd", "artifacts/../../x", "escape/passwd"]
)
def test_fetch_refuses_paths_outside_the_work_dir(
    scripted_bridge, tmp_path: Path, hostile: str
) -> None:
    (tmp_path / "escape").symlink_to("/etc")
    socket_path = scripted_bridge(lambda route, body: json_reply([{"path": hostile, "size": 1}]))
    with pytest.raises(UnsafePathError, match="refused path"):
        Alpha17Bridge(socket_path, tmp_path).fetch(SLICE)


def test_fetch_returns_checked_absolute_paths(scripted_bridge, tmp_path: Path) -> None:
    seen: list[dict[str, object]] = []

    def answer(route: str, body: bytes) -> Reply:
        seen.append(json.loads(body))
        return json_reply([{"path": "artifacts/17", "size": 3}])

    files = Alpha17Bridge(scripted_bridge(answer), tmp_path).fetch(SLICE)
    assert files[0].path == tmp_path.resolve() / "artifacts" / "17" and files[0].size == 3
    assert seen == [
        {"type": "scheduler", "peer": "12D3KooWsched", "dataset": "d"}
    ]  # bare reference


def test_bridge_json_error_becomes_a_specific_exception(scripted_bridge, tmp_path: Path) -> None:
    socket_path = scripted_bridge(
        lambda route, body: json_reply(
            {"error": "network_error", "detail": "peer\nunreachable"}, 500
        )
    )
    with pytest.raises(BridgeError) as failed:
        Alpha17Bridge(socket_path, tmp_path).send(PEERS, "x")
    assert failed.value.status == 500 and failed.value.error == "network_error"
    assert "peer unreachable" in str(failed.value) and "\n" not in str(failed.value)


def test_plain_text_rejection_is_reported(scripted_bridge, tmp_path: Path) -> None:
    socket_path = scripted_bridge(
        lambda route, body: (422, "text/plain", b"batch_size: invalid type")
    )
    with pytest.raises(BridgeError, match="422 http_error: batch_size: invalid type"):
        Alpha17Bridge(socket_path, tmp_path).status(batch_status(8))


def test_nan_is_never_sent(scripted_bridge, tmp_path: Path) -> None:
    socket_path = scripted_bridge(lambda route, body: json_reply({"type": "Ok"}))
    with pytest.raises(ValueError):
        Alpha17Bridge(socket_path, tmp_path).status(round_metrics(1, {"loss": float("nan")}))


def test_missing_socket_is_bridge_gone(tmp_path: Path) -> None:
    with pytest.raises(BridgeGoneError, match="does not exist"):
        Alpha17Bridge(tmp_path / "nothing.sock", tmp_path).status("update")


def test_receive_parses_events_and_ignores_other_lines(scripted_bridge, tmp_path: Path) -> None:
    stream = (
        b": keepalive\n\n"
        b"event: update\nid: 1\n"
        b'data: {"path": "incoming/12D3KooWps", "size": 4, "from_peer": "12D3KooWps"}\n\n'
        b": keepalive\n\n"
        b'data: {"path": "incoming/12D3KooWother",\ndata:  "size": 5, "from_peer": "12D3KooWother"}\n\n'
    )
    socket_path = scripted_bridge(lambda route, body: (200, "text/event-stream", stream))
    events = Alpha17Bridge(socket_path, tmp_path).receive(PEERS)
    first, second = next(events), next(events)
    assert (first.path.name, first.size, first.from_peer) == ("12D3KooWps", 4, "12D3KooWps")
    assert (second.path.name, second.from_peer) == ("12D3KooWother", "12D3KooWother")
    with pytest.raises(BridgeGoneError, match="closed the update stream"):
        next(events)  # a closed stream is never "training finished"


def test_executor_refuses_a_hostile_bridge_with_one_line(scripted_bridge, tmp_path: Path) -> None:
    socket_path = scripted_bridge(
        lambda route, body: json_reply([{"path": "../../etc/passwd", "size": 1}])
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.training", "--socket", str(socket_path),
         "--work-dir", str(tmp_path), "--job", f"@{CAUSAL_LM}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "hypha.accelerate_executor.training: refused path '../../etc/passwd': not a relative path inside the work dir"
    ]
    assert time.monotonic() - started < 60


def test_a_standing_receive_is_on_the_bridges_socket_before_it_returns(tmp_path: Path) -> None:
    """The action loop reports `sent-update` right after opening its standing receive, and that
    report is what makes the parameter server push: the receive's request must be on the
    bridge's socket by then, not on a thread that has yet to run (a push was lost so on a
    loaded machine). The bridge here accepts but never answers; checked without waiting."""
    import socket

    from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
    from hypha.accelerate_executor.training.actions.bridge import (
        ActionBridgeClient,
        standing_receive,
    )

    path = tmp_path / "bridge.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    source = ActionPeersReference.model_validate(
        {"type": "peers", "peers": [PS_PEER], "strategy": {"type": "All"}, "resource": None}
    )
    client = ActionBridgeClient(path, tmp_path, "job-1")
    with listener:
        standing_receive(client, source, "incoming")
        listener.setblocking(False)
        connection, _ = listener.accept()  # raises BlockingIOError when nothing connected yet
        with connection:
            connection.setblocking(False)
            request = connection.recv(65536)
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /resources/receive ")
    assert json.loads(body)["resource"]["peers"] == [PS_PEER]
