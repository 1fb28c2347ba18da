"""A push's fate reaches its pusher, as upstream's connector fails a send the peer's worker
refuses: a peer's model for a late joiner fails its send unless a receive takes it within
the sender's tries, and an aggregate a worker's bridge refuses fails the run. Real action
bridges on Unix sockets, reaching a real coordinator over its TCP API."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hypha.accelerate_executor.protocol.actions.messages import JOINED, SendUpdate, batch_completed
from hypha.accelerate_executor.protocol.actions.messages import sent_update as sent_update_status
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.standin.actions.scheduler import peers
from hypha.standin.coordinator.report import judge
from hypha.standin.errors import BackendError

BATCH = 8


def two_workers(
    make_coordinator: Callable[..., Any],
    make_bridge: Callable[..., Any],
    strict: tuple[bool, bool],
) -> tuple[Any, list[Any], list[ActionBridgeClient]]:
    coordinator = make_coordinator(
        generation="actions", workers=2, batch_size=BATCH, samples_per_round=BATCH
    )
    bridges, clients = [], []
    for name, strict_receive in zip(("w1", "w2"), strict, strict=True):
        bridge, job = make_bridge(
            coordinator, name, generation="actions", strict_receive=strict_receive
        )
        client = ActionBridgeClient(bridge.socket_path, bridge.work_dir, job["job_id"])
        client.update(JOINED)
        bridges.append(bridge)
        clients.append(client)
    return coordinator, bridges, clients


def peer_of(coordinator: Any, client: ActionBridgeClient) -> str:
    return str(coordinator.workers[client.job_id].peer_id)


def test_a_peers_push_no_receive_takes_fails_its_send(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    coordinator, (sender, _), (_, w2) = two_workers(
        make_coordinator, make_bridge, strict=(True, True)
    )
    with pytest.raises(BackendError) as refused:
        sender.backend.send(peer_of(coordinator, w2), b"a model")
    assert refused.value.kind == "connector_error"
    assert "refused the push: no receive open" in refused.value.detail


def test_a_receive_opened_within_the_senders_tries_takes_the_push(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    coordinator, (sender, joiner), (w1, w2) = two_workers(
        make_coordinator, make_bridge, strict=(True, True)
    )
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            sender.backend.send(peer_of(coordinator, w2), b"a model")
            outcome.append(None)
        except BackendError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 30
    while not joiner.pushes_held():  # the push is at the joiner's bridge, held for its tries
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.01)
    source = peers([peer_of(coordinator, w1)], "All")
    received = w2.receive_one(source, "incoming", time.time() + 30)
    thread.join(30)
    assert received is not None and received.path.read_bytes() == b"a model"
    assert outcome == [None]  # the sender's send succeeded


def test_a_lenient_bridge_keeps_the_push_and_the_send_succeeds(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    coordinator, (sender, _), (w1, w2) = two_workers(
        make_coordinator, make_bridge, strict=(True, False)
    )
    sender.backend.send(peer_of(coordinator, w2), b"a model")
    source = peers([peer_of(coordinator, w1)], "All")
    received = w2.receive_one(source, "incoming", time.time() + 30)
    assert received is not None and received.path.read_bytes() == b"a model"


def test_an_aggregate_a_bridge_refuses_fails_the_run(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    """w1 has no receive open when round 0's aggregate is pushed (upstream's broadcast fails
    there); w2 has one open and takes it."""
    coordinator, (strict, _), (w1, w2) = two_workers(
        make_coordinator, make_bridge, strict=(True, True)
    )
    source = peers([coordinator.parameter_server_peer], "All")
    taken: list[Any] = []
    receiving = threading.Thread(
        target=lambda: taken.append(w2.receive_one(source, "incoming", time.time() + 60))
    )
    receiving.start()
    asked = [client.update(batch_completed(BATCH, 1)) for client in (w1, w2)]
    for index, (client, action) in enumerate(zip((w1, w2), asked, strict=True)):
        assert isinstance(action, SendUpdate), action
        save_file({"w": torch.tensor([float(index)])}, str(client.work_dir / "u.safetensors"))
        client.send_file(action.target, "u.safetensors", remove_file=True)
        client.update(sent_update_status(0, {"batches": 1.0}))
    receiving.join(60)
    assert taken and taken[0] is not None  # w2's receive took round 0's aggregate
    deadline = time.monotonic() + 30
    while not coordinator.summary()["refused_broadcasts"]:
        assert time.monotonic() < deadline, "w1's refusal never reached the coordinator"
        time.sleep(0.05)
    [refusal] = coordinator.summary()["refused_broadcasts"]
    assert refusal.startswith("w1's bridge refused round 0's aggregate: no receive was open")
    assert refusal in judge(coordinator.summary())["reasons"]
    assert strict.receives_answered() == 0
