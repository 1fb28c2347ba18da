"""Transient failures of the bridge tried again, final ones not, over real HTTP on real Unix
sockets: each route of both generations against a bridge that fails as upstream's does when
its remote side is unreachable (500 with network_error, connector_error, io_error)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from hypha.accelerate_executor.bridge.client import BridgeClient
from hypha.accelerate_executor.bridge.retry import (
    BridgeRetriesExhausted,
    RetryPolicy,
    retrying,
)
from hypha.accelerate_executor.errors import BridgeError, BridgeGoneError
from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
from hypha.accelerate_executor.protocol.actions.messages import Terminate, batch_completed
from hypha.accelerate_executor.protocol.alpha17.job import PeersReference
from hypha.accelerate_executor.protocol.alpha17.messages import Continue, batch_status
from hypha.accelerate_executor.protocol.job import SchedulerReference
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.accelerate_executor.training.alpha17.bridge import Alpha17Bridge
from hypha.accelerate_executor.training.alpha17.status_reporter import StatusReporter
from unix_http import QuietHandler, serving

QUICK = RetryPolicy(first_pause_s=0.01, max_pause_s=0.05, total_s=0.5)
SLICE = SchedulerReference(type="scheduler", peer="12D3KooWsched", dataset="d")
PEERS = PeersReference.model_validate({"type": "peers", "peers": [], "strategy": {"type": "All"}})
PS = "12D3KooWJ6MBkbH3o7j2yhhDAF7gRxA4Zm5cpuEUr2Znp1VvNBw3"
ACTION_PEERS = ActionPeersReference.model_validate(
    {"type": "peers", "peers": [PS], "strategy": {"type": "All"}}
)
Answer = tuple[int, object]  # status, JSON body


class Flaky:
    """A bridge that answers each route's first `failures` requests with `failure`, then
    `ok`; it records every request body, by route."""

    def __init__(self, failures: int, failure: Answer, ok: Callable[[str], Answer]) -> None:
        self.failures = failures
        self.failure = failure
        self.ok = ok
        self.seen: dict[str, list[bytes]] = {}

    def answer(self, route: str, body: bytes) -> Answer:
        tries = self.seen.setdefault(route, [])
        tries.append(body)
        return self.failure if len(tries) <= self.failures else self.ok(route)


@pytest.fixture
def flaky(tmp_path: Path) -> Iterator[Callable[[Flaky], Path]]:
    with ExitStack() as servers:

        def start(script: Flaky) -> Path:
            class Handler(QuietHandler):
                protocol_version = "HTTP/1.1"

                def do_POST(self) -> None:
                    body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                    status, value = script.answer(self.path, body)
                    self.reply_json(value, status)

            return servers.enter_context(serving(tmp_path / "bridge.sock", Handler))

        yield start


def ok(route: str) -> Answer:
    if route == "/resources/fetch":
        return 200, [{"path": "artifacts/1", "size": 1}]
    if route == "/action/update":
        return 200, {"job_id": "j", "next": {"executor": "train", "action": {"kind": "terminate"}}}
    if route == "/resources/send":
        return 200, None
    return 200, {"type": "Continue"}


def error(status: int, kind: str) -> Answer:
    return status, {"error": kind, "detail": "the remote side is unreachable"}


def client_of(socket_path: Path, work_dir: Path) -> ActionBridgeClient:
    client = ActionBridgeClient(socket_path, work_dir, "j")
    client.retry_policy = QUICK
    return client


@pytest.mark.parametrize("kind", ["network_error", "connector_error", "io_error"])
def test_each_route_survives_a_5xx_once(flaky, tmp_path: Path, kind: str) -> None:
    script = Flaky(1, error(500, kind), ok)
    client = client_of(flaky(script), tmp_path)
    alpha17 = Alpha17Bridge(client.socket_path, tmp_path)  # the other generation's routes
    alpha17.retry_policy = QUICK
    (tmp_path / "update.safetensors").write_bytes(b"x")
    assert [f.size for f in client.fetch(SLICE)] == [1]
    assert alpha17.status(batch_status(8)) == Continue()
    alpha17.send(PEERS, "update.safetensors")
    client.send_file(ACTION_PEERS, "update.safetensors", remove_file=True)
    assert client.update(batch_completed(8, 1)) == Terminate()
    # Each route tried twice, and the second try is the first's request unchanged.
    assert {route: len(bodies) for route, bodies in script.seen.items()} == {
        "/resources/fetch": 2,
        "/status/send": 2,
        "/resources/send": 3,  # the first 500, then one for each generation's send
        "/action/update": 2,
    }
    assert all(bodies[0] == bodies[1] for bodies in script.seen.values())


def test_a_4xx_is_final_and_sent_once(flaky, tmp_path: Path) -> None:
    script = Flaky(5, error(400, "invalid_request"), ok)
    client = client_of(flaky(script), tmp_path)
    with pytest.raises(BridgeError, match="400 invalid_request") as failed:
        client.fetch(SLICE)
    assert not isinstance(failed.value, BridgeRetriesExhausted)
    assert len(script.seen["/resources/fetch"]) == 1


def test_a_hash_mismatch_is_fetched_again(flaky, tmp_path: Path) -> None:
    """Upstream's bridge answers 400 hash_mismatch when a data node's bytes do not hash to
    the slice, and retries that download itself: the cause is the peer, not the request."""
    script = Flaky(2, error(400, "hash_mismatch"), ok)
    client = client_of(flaky(script), tmp_path)
    assert [f.size for f in client.fetch(SLICE)] == [1]
    assert len(script.seen["/resources/fetch"]) == 3


def test_a_lasting_5xx_gives_up_in_one_line_naming_route_tries_and_time(
    flaky, tmp_path: Path
) -> None:
    script = Flaky(10**6, error(500, "network_error"), ok)
    client = client_of(flaky(script), tmp_path)
    with pytest.raises(BridgeRetriesExhausted) as failed:
        client.update(batch_completed(8, 1))
    message = str(failed.value)
    assert message.startswith("bridge /action/update failed: 500 network_error:")
    assert f"still failing after {len(script.seen['/action/update'])} tries over" in message
    assert len(script.seen["/action/update"]) > 2 and "\n" not in message


def test_a_send_whose_file_the_bridge_removed_is_not_sent_again(flaky, tmp_path: Path) -> None:
    script = Flaky(10**6, error(500, "connector_error"), ok)
    client = client_of(flaky(script), tmp_path)
    with pytest.raises(BridgeError, match="500 connector_error"):
        client.send_file(ACTION_PEERS, "gone.safetensors", remove_file=True)
    assert len(script.seen["/resources/send"]) == 1


def test_a_receive_is_tried_again_only_until_its_deadline(flaky, tmp_path: Path) -> None:
    import time

    script = Flaky(1, error(500, "network_error"), lambda route: (204, None))
    client = client_of(flaky(script), tmp_path)
    # Under a second to go: the 204 is the deadline's, not a refused registration.
    assert client.receive_one(ACTION_PEERS, "incoming", time.time() + 0.8) is None
    assert len(script.seen["/resources/receive"]) == 2


def test_a_refused_connection_is_tried_again_a_missing_socket_is_final(tmp_path: Path) -> None:
    tries = []

    def refused() -> None:
        tries.append(1)
        raise BridgeGoneError("refused", transient=True)

    with pytest.raises(BridgeGoneError, match=r"/x: still failing after \d+ tries"):
        retrying("/x", refused, QUICK)
    assert len(tries) > 2
    client = client_of(tmp_path / "no.sock", tmp_path)
    with pytest.raises(BridgeGoneError, match=r"does not exist$"):
        client.fetch(SLICE)


def test_a_status_answered_5xx_is_sent_again_and_answered(flaky, tmp_path: Path) -> None:
    script = Flaky(2, error(500, "network_error"), ok)
    bridge = BridgeClient(flaky(script), tmp_path)
    bridge.retry_policy = QUICK
    reporter = StatusReporter(bridge)
    for batch in (1, 2, 3):
        reporter.batch_done(batch, 8)
    answers = reporter.flush()
    reporter.close()
    assert sorted(a.batch for a in answers) == [1, 2, 3]
    assert all(a.answer == Continue() for a in answers)
    assert [json.loads(b) for b in script.seen["/status/send"]] == [
        {"status": {"batch_size": 8}}
    ] * 5
