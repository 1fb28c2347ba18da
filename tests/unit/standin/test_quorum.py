"""The stand-in's parameter server aggregates as upstream's scheduler tells it to: at a quorum
once the grace time has passed, the slow update going into the next round. Three real action
bridges on Unix sockets, driven by the executor's own bridge client."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hypha.accelerate_executor.protocol.actions.messages import (
    APPLIED_UPDATE,
    IDLE,
    JOINED,
    WAITED_FOR_MODEL,
    ExecuteBatch,
    Idle,
    ReceiveModel,
    SendModel,
    SendUpdate,
    Terminate,
    WaitForModel,
    batch_completed,
    sent_update,
)
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.standin.actions.scheduler import ActionScheduler, peers
from hypha.standin.parameter_server.server import NesterovOuterOptimizer

BATCH = 8


class FakeClock:
    """The coordinator's clock, moved by the test: the grace time without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def workers(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any], **options: Any
) -> tuple[Any, list[ActionBridgeClient]]:
    """A 3-worker action-era run whose round is one batch of one worker. Its bridges keep
    an aggregate pushed while no receive is open (kinder than upstream's, which refuse it):
    these tests are about the parameter server's quorum, and read each aggregate after the
    fact rather than keeping a receive open as the executor does."""
    coordinator = make_coordinator(
        generation="actions", workers=3, batch_size=BATCH, samples_per_round=BATCH, **options
    )
    clients = []
    for name in ("w1", "w2", "w3"):
        bridge, job = make_bridge(coordinator, name, generation="actions", strict_receive=False)
        client = ActionBridgeClient(bridge.socket_path, bridge.work_dir, job["job_id"])
        assert isinstance(client.update(JOINED), Idle)
        clients.append(client)
    return coordinator, clients


def send(client: ActionBridgeClient, action: Any, values: list[float], name: str) -> None:
    """What the executor does with `send-update`: the file to the target, then `sent-update`."""
    assert isinstance(action, SendUpdate), action
    save_file({"w": torch.tensor(values)}, str(client.work_dir / name))
    client.send_file(action.target, name, remove_file=True)
    client.update(sent_update(0, {"batches": 1.0}))


def test_a_quorum_aggregates_and_the_slow_update_goes_into_the_next_round(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    coordinator, (w1, w2, w3) = workers(make_coordinator, make_bridge, quorum=2, grace_s=0.0)
    asked = [client.update(batch_completed(BATCH, 1)) for client in (w1, w2, w3)]
    send(w1, asked[0], [1.0, 2.0], "a.safetensors")
    send(w2, asked[1], [3.0, 6.0], "b.safetensors")  # the quorum: w1 and w2 are aggregated
    send(w3, asked[2], [9.0, 9.0], "c.safetensors")  # too late for round 0
    assert coordinator.wait_for_round(1, 30)
    aggregations = coordinator.aggregation.rounds
    assert [entry["workers"] for entry in aggregations] == [["w1", "w2"]]
    first_push = received_update(coordinator, w2)
    # w3's update waits for round 1's aggregate, and w3 is not asked to send another.
    assert isinstance(w3.update(IDLE), Idle)
    send(w1, w1.update(batch_completed(BATCH, 1)), [0.0, 4.0], "d.safetensors")
    assert coordinator.wait_for_round(2, 30)
    assert [entry["workers"] for entry in coordinator.aggregation.rounds] == [
        ["w1", "w2"],
        ["w1", "w3"],
    ]
    # Each round's update is the outer step over exactly the files it took (weighted: summed).
    expected = NesterovOuterOptimizer(0.7, 0.9, weighted=True)
    first, _ = expected.step([{"w": torch.tensor(v)} for v in ([1.0, 2.0], [3.0, 6.0])])
    second, _ = expected.step([{"w": torch.tensor(v)} for v in ([0.0, 4.0], [9.0, 9.0])])
    torch.testing.assert_close(first_push["w"], first["w"])
    torch.testing.assert_close(received_update(coordinator, w2)["w"], second["w"])


def test_the_grace_time_holds_a_quorum_back(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    clock = FakeClock()
    coordinator, (w1, w2, _) = workers(
        make_coordinator, make_bridge, clock=clock, quorum=2, grace_s=5.0
    )
    asked = [client.update(batch_completed(BATCH, 1)) for client in (w1, w2)]
    send(w1, asked[0], [1.0], "a.safetensors")
    send(w2, asked[1], [3.0], "b.safetensors")
    # The quorum is in, the grace time is not over: the decision is taken under the
    # coordinator's lock as the status is answered, so nothing has started.
    assert coordinator.aggregation.rounds == [] and not coordinator.aggregation._busy
    clock.now += 5.0
    w1.update(IDLE)  # any status looks again (a timer does too, with no status at all)
    assert coordinator.wait_for_round(1, 30)
    assert [entry["workers"] for entry in coordinator.aggregation.rounds] == [["w1", "w2"]]


def test_every_sender_in_needs_no_grace(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    coordinator, clients = workers(make_coordinator, make_bridge, quorum=3, grace_s=3600.0)
    asked = [client.update(batch_completed(BATCH, 1)) for client in clients]
    for index, (client, action) in enumerate(zip(clients, asked, strict=True)):
        send(client, action, [float(index)], f"{index}.safetensors")
    assert coordinator.wait_for_round(1, 30)
    assert [entry["workers"] for entry in coordinator.aggregation.rounds] == [["w1", "w2", "w3"]]


def test_no_round_is_averaged_after_the_last(
    make_coordinator: Callable[..., Any], make_bridge: Callable[..., Any]
) -> None:
    """The job's one round closes at the quorum without w3; once w1 and w2 have ended, w3's
    update is every remaining sender's, but the job is over: nothing is averaged (before, a
    round past the end was, on a thread that a process exiting meanwhile aborted in)."""
    coordinator, (w1, w2, w3) = workers(
        make_coordinator, make_bridge, quorum=2, grace_s=0.0, rounds=1
    )
    asked = [client.update(batch_completed(BATCH, 1)) for client in (w1, w2, w3)]
    send(w1, asked[0], [1.0], "a.safetensors")
    send(w2, asked[1], [3.0], "b.safetensors")
    assert coordinator.wait_for_round(1, 30)
    send(w3, asked[2], [9.0], "c.safetensors")
    for client in (w1, w2):
        coordinator.report_exit(client.job_id, 0, [])
    assert len(coordinator.aggregation.rounds) == 1 and not coordinator.aggregation._busy
    assert coordinator.aggregation.pending_jobs() == [w3.job_id]


def received_update(coordinator: Any, client: ActionBridgeClient) -> dict[str, Any]:
    """The aggregate pushed to `client`'s bridge: kept there, as no receive was open."""
    source = peers([coordinator.parameter_server_peer], "All")
    received = client.receive_one(source, "incoming", time.time() + 30)
    assert received is not None
    return load_file(received.path)


def test_a_carried_sender_takes_no_batch_in_the_next_rounds_simulation() -> None:
    """A worker whose update missed the aggregate sits the next round out (its update is
    in): the simulation leaves it out, or its stale clock would take every batch left and the
    others would be told `execute-batch{0}` for ever (seen with a late joiner, 4 rounds)."""
    w1, w2, w3, ps = "12D3KooWw1", "12D3KooWw2", "12D3KooWw3", "12D3KooWPs"
    now = [0.0]
    s = ActionScheduler(10_000, 5, ps, clock=lambda: now[0], wall=lambda: 1.7e9)
    for peer in (w1, w2, w3):
        s.add_worker(peer, BATCH)
    for at_s in (1.0, 2.0, 3.0):  # every worker gets a mean of 1 s a batch
        now[0] = at_s
        for peer in (w1, w2, w3):
            s.answer(peer, batch_completed(BATCH, 1))
    s.sent.add(w3)  # w3's update missed round 0's aggregate
    s.aggregated()
    s.broadcasted(keep_sent={w3})
    assert s.sent == {w3}
    now[0] = 60.0  # w3 has not reported since 3 s: played forward, it would take them all
    s.answer(w2, batch_completed(BATCH, 1))
    action = s.answer(w1, batch_completed(BATCH, 1))
    assert isinstance(action, ExecuteBatch) and action.batches > 0, action


def after_one_round(worker: str, rounds: int) -> ActionScheduler:
    """A scheduler of `rounds` rounds whose first round `worker` alone trained, sent and
    had aggregated."""
    s = ActionScheduler(BATCH, rounds, "12D3KooWPs", clock=lambda: 0.0, wall=lambda: 1.7e9)
    s.add_worker(worker, BATCH)
    s.answer(worker, batch_completed(BATCH, 1))
    s.answer(worker, sent_update(0, {}))
    s.aggregated()
    s.broadcasted()
    return s


def test_a_joiner_is_sent_the_model_only_once_its_executor_has_joined() -> None:
    """Upstream's order: a late joiner waits for the model from its `joined`, as its
    executor can open a receive only from then on (upstream's worker refuses a push while
    none is open). Until then a round does not wait for it; from the `send-model` on, one
    does (it trains from the model on its way)."""
    w1, w3 = "12D3KooWw1", "12D3KooWw3"
    s = after_one_round(w1, rounds=5)
    s.add_worker(w3, BATCH)  # assigned in round 1, its executor not up yet
    assert s.senders() == [w1]
    assert isinstance(s.answer(w1, APPLIED_UPDATE), ExecuteBatch)  # no model for it yet
    assert isinstance(s.answer(w3, JOINED), WaitForModel)
    assert isinstance(s.answer(w3, WAITED_FOR_MODEL), WaitForModel)  # nobody sends yet
    assert s.senders() == [w1]
    sent = s.answer(w1, APPLIED_UPDATE)
    assert isinstance(sent, SendModel) and sent.target.peers == [w3]
    assert s.senders() == [w1, w3]
    received = s.answer(w3, WAITED_FOR_MODEL)
    assert isinstance(received, ReceiveModel) and received.source.peers == [w1]
    assert not isinstance(s.answer(w1, APPLIED_UPDATE), SendModel)  # no second model


def test_a_joiner_still_waiting_once_the_model_is_pushed_is_told_to_terminate() -> None:
    """Upstream's scheduler cancels the job once the final model is pushed, which ends a
    joiner still waiting for a model; the stand-in, which leaves the cancel out, answers
    that joiner's next `waited-for-model` with `terminate` instead of waiting for ever."""
    w1, w3 = "12D3KooWw1", "12D3KooWw3"
    s = after_one_round(w1, rounds=1)  # the only round: training is complete
    s.add_worker(w3, BATCH)  # assigned after it
    assert isinstance(s.answer(w3, JOINED), WaitForModel)
    assert isinstance(s.answer(w1, APPLIED_UPDATE), Idle)
    assert isinstance(s.answer(w1, IDLE), Terminate)  # no destination: the push is done
    assert isinstance(s.answer(w3, WAITED_FOR_MODEL), Terminate)
