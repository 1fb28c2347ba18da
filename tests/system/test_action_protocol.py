"""The action protocol end to end: the executor as a real process against the stand-in's
action-era bridge on a real Unix socket, both with the stand-in's scheduler (a real 2-worker
job whose loss falls) and with a scripted one for the sharp edges of
docs/protocol-actions.md: `execute-batch{0}`, a straggler's `apply-update` without a send,
a receive whose deadline has passed, SIGTERM in the middle of a long `idle`, and an aggregate
pushed before `apply-update` to a bridge that drops pushes no receive is open for."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load, save

from action_bridges import (
    JOB_ID,
    PS,
    action_bridge,
    later,
    push_once_receiving,
    run_executor,
    until,
    zero_update,
)
from hypha.accelerate_executor.bridge.client import probe_generation
from hypha.accelerate_executor.errors import BridgeError
from hypha.accelerate_executor.protocol.actions.messages import (
    Action,
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    SendUpdate,
    Terminate,
    action_request,
    batch_completed,
    parse_action_response,
    sent_update,
)
from hypha.accelerate_executor.protocol.messages import wire
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.accelerate_executor.training.diloco import GlobalWeights
from hypha.standin.actions.scheduler import peers
from hypha.standin.alpha17.bridge_http import Alpha17BridgeServer
from hypha.standin.backend import Push
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.demo import run_demo
from hypha.standin.worker.executor_entries import preset

# Messages.


def test_the_older_forms_of_execute_batch_are_one_batch() -> None:
    def answer(action: dict[str, Any]) -> Any:
        return parse_action_response(
            {"job_id": JOB_ID, "next": {"executor": "train", "action": action}}, JOB_ID
        )

    assert answer({"kind": "execute-batch", "batches": 0}) == ExecuteBatch(0)
    assert answer({"kind": "execute-batch"}) == ExecuteBatch(1)
    assert answer({"kind": "execute-batch", "lr_multiplier": 0.5}) == ExecuteBatch(1, 0.5)
    assert action_request(JOB_ID, batch_completed(8, 0))["status"]["details"] == {
        "state": "batch-completed",
        "batch_size": 8,
        "batches": 0,
    }


def test_a_weighted_pseudo_gradient_scales_floats_and_leaves_counters(tmp_path: Path) -> None:
    start = {"w": torch.zeros(3), "n": torch.tensor([2], dtype=torch.int64)}
    local = {"w": torch.tensor([1.0, 2.0, 4.0]), "n": torch.tensor([5], dtype=torch.int64)}
    weights = GlobalWeights(start)
    weights.write_pseudo_gradient(local, tmp_path / "u.safetensors", torch.float32, 0.25)
    sent = load((tmp_path / "u.safetensors").read_bytes())
    assert torch.equal(sent["w"], torch.tensor([0.25, 0.5, 1.0]))
    assert torch.equal(sent["n"], torch.tensor([3]))


# The bridge, on a real socket.


def test_the_probe_and_the_action_era_routes(assets_dir: Path, short_tmp: Path) -> None:
    def script(details: dict[str, Any]) -> Action:
        return Idle(later(0))

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        assert probe_generation(bridge.socket_path) == "actions"
        client = ActionBridgeClient(
            bridge.socket_path, bridge.work_dir, json.loads(job_json)["job_id"]
        )
        target = peers([PS], "All")
        (bridge.work_dir / "update.safetensors").write_bytes(b"bytes")
        client.send_file(target, "update.safetensors", remove_file=True)
        assert backend.sent == [(PS, b"bytes")]
        assert not (bridge.work_dir / "update.safetensors").exists()
        # A deadline that has passed is never sent: the bridge would wait for ever.
        assert client.receive_one(target, "incoming", time.time() - 1) is None
        assert client.receive_one(target, "incoming", time.time() + 0.3) is None  # 204
        # Strict: a push that comes while no receive is open is dropped; a peer's only once
        # its sender's tries are over (upstream's bridge tries a refused send for a while).
        bridge._deliver(Push(100, PS, b"nobody receives this"))
        assert client.receive_one(target, "incoming", time.time() + 0.3) is None
        bridge._deliver(Push(101, PS, b"tried again", retry_s=5.0))
        received = client.receive_one(target, "incoming", time.time() + 0.3)
        assert received is not None and received.path.read_bytes() == b"tried again"
        bridge._deliver(Push(102, PS, b"tried too briefly", retry_s=0.1))
        time.sleep(0.5)
        assert client.receive_one(target, "incoming", time.time() + 0.3) is None
        push_once_receiving(bridge, backend, b"an update")
        received = client.receive_one(target, "incoming", time.time() + 30)
        assert received is not None and received.from_peer == PS
        assert received.path.read_bytes() == b"an update"
        # Strict: one receive at a time; a second beside it is answered 204 at once (the
        # client asks again until its deadline), and the push goes to the first.
        first: list[Any] = []
        opened = threading.Thread(
            target=lambda: first.append(client.receive_one(target, "first", time.time() + 30))
        )
        opened.start()
        until(lambda: bridge.receives_open() == 1)
        assert client.receive_one(target, "second", time.time() + 1.5) is None
        push_once_receiving(bridge, backend, b"the next")
        opened.join(30)
        assert first[0] is not None and first[0].path.read_bytes() == b"the next"
        with pytest.raises(BridgeError, match="422"):
            client.post_json("/resources/send", {"resource": wire(target), "path": "x"}, 5)
        with pytest.raises(BridgeError, match="404"):
            client.post_json("/status/send", "update", 5)
    lenient = action_bridge(assets_dir, short_tmp / "kind", script, strict_receive=False)
    with lenient as (job_json, bridge, backend):
        # Not strict: the push waits for the next receive.
        bridge._deliver(Push(100, PS, b"kept"))
        client = ActionBridgeClient(
            bridge.socket_path, bridge.work_dir, json.loads(job_json)["job_id"]
        )
        received = client.receive_one(target, "incoming", time.time() + 30)
        assert received is not None and received.path.read_bytes() == b"kept"
    alpha17 = short_tmp / "alpha17"
    alpha17.mkdir()
    with Alpha17BridgeServer(alpha17, backend) as old:
        assert probe_generation(old.socket_path) == "alpha17"


@pytest.mark.slow
def test_batches_zero_a_straggler_a_past_deadline_and_terminate(
    assets_dir: Path, short_tmp: Path
) -> None:
    source = peers([PS], "All")
    steps = iter([
        ExecuteBatch(0),
        ExecuteBatch(2),
        ApplyUpdate(source, later(60)),  # never sent: a straggler
        ApplyUpdate(source, later(-5)),
        SendUpdate(source, 0.5),
        Terminate(),
    ])  # fmt: skip

    def script(details: dict[str, Any]) -> Action:
        return next(steps)

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        push_once_receiving(bridge, backend, zero_update(assets_dir))  # the straggler's
        process = run_executor(job_json, bridge)
        out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert out.splitlines()[0].endswith(
        "bridge generation actions (the job has no updates or results)"
    )
    states = [d["state"] for d in backend.statuses]
    assert states == [
        "joined", "idle", "batch-completed", "applied-update", "error", "sent-update",
    ]  # fmt: skip
    # execute-batch{0} is answered idle: it trained nothing, and idle moves no clock.
    assert backend.statuses[2]["batches"] == 2
    assert backend.statuses[4]["type"] == "connection"  # nothing received: deadline passed
    sent = backend.statuses[5]
    assert sent["round"] == 1 and sent["metrics"]["weight"] == 0.5
    # The straggler's 2 batches are in no aggregate: kept on top of the one it applied, and
    # counted, with their loss, in its next sent update (a quorum closed its round without it).
    assert sent["metrics"]["batches"] == 2 and sent["metrics"]["loss"] > 0
    ((peer, data),) = backend.sent
    assert peer == PS and set(load(data)) == set(load(zero_update(assets_dir)))
    # Unset, the action protocol's pseudo-gradients are bfloat16, as upstream's executor's.
    floats = [t for t in load(data).values() if t.is_floating_point()]
    assert floats and all(t.dtype == torch.bfloat16 for t in floats)
    assert any(bool(t.any()) for t in floats)  # the 2 batches' drift, not a zero update


@pytest.mark.slow
def test_sigterm_in_a_long_idle_ends_cleanly_within_5_s(assets_dir: Path, short_tmp: Path) -> None:
    def script(details: dict[str, Any]) -> Action:
        # Upstream's idle is half a second: this one reads as a scheduler 599.5 s ahead
        # (training/actions/scheduler_clock.py), so the executor idles half a second at a time.
        return Idle(later(600))

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        process = run_executor(job_json, bridge)
        try:
            deadline = time.monotonic() + 180
            while not backend.statuses:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.2)
            time.sleep(0.5)
            os.kill(process.pid, signal.SIGTERM)
            started = time.monotonic()
            _, err = process.communicate(timeout=10)
            took = time.monotonic() - started
        finally:
            process.kill()
    assert process.returncode == 143 and took < 5, (process.returncode, took, err)
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("broadcast_over", ["delivered", "applied"])
def test_two_workers_train_over_the_action_protocol_and_the_loss_falls(
    assets_dir: Path, tmp_path: Path, short_tmp: Path, broadcast_over: Any
) -> None:
    """In upstream's order (the round moves on once the push is on every bridge, so the
    workers are told `execute-batch`, not `apply-update`) and in the older one."""
    options = RunOptions(
        workers=2, rounds=3, steps_per_round=20, generation="actions",
        broadcast_over=broadcast_over,
    )  # fmt: skip
    # Strict bridges: each update is received because the executor opened its receive
    # before `sent-update`, not because the stand-in kept a push nobody received.
    code = run_demo(
        options, preset("process"), out_dir=tmp_path / "out", work_base=short_tmp,
        assets_dir=assets_dir, strict_receive=True, timeout_s=600,
    )  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 0, summary["reasons"]
    assert [w["exit_code"] for w in summary["workers"].values()] == [0, 0]
    assert len(summary["rounds"]) == 3
    assert summary["final_mean_loss"] < 0.6 * summary["first_mean_loss"]
    # Every aggregate applied in its round: each worker's k-th update is sent from round k,
    # from the same global model as the other's (its digest).
    workers = list(summary["workers"].values())
    for worker in workers:
        assert sorted(worker["metrics"]) == ["0", "1", "2"], worker["metrics"]
    digests = [[w["metrics"][r]["global_digest"] for w in workers] for r in ("0", "1", "2")]
    assert all(len(set(per_round)) == 1 for per_round in digests), digests
    assert len({per_round[0] for per_round in digests}) == 3  # and it moved each round
    assert summary["digest_mismatches"] == []


def test_the_coordinator_names_a_worker_whose_global_model_differs(assets_dir: Path) -> None:
    options = RunOptions(workers=2, rounds=2, generation="actions")
    coordinator = build_coordinator(Catalog.from_assets(ensure_assets(assets_dir)), options)
    jobs = [json.loads(json.dumps(coordinator.assign_job(name)))["job_id"] for name in ("w1", "w2")]
    for job_id, digest in zip(jobs, (0xABCDEF, 0x123456), strict=True):
        status = sent_update(0, {"batches": 1.0, "weight": 0.5, "global_digest": float(digest)})
        coordinator.action(job_id, action_request(job_id, status))
    assert coordinator.summary()["digest_mismatches"] == [
        "w2's global model after 0 aggregate(s) (digest 123456) differs from w1's (abcdef)"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("pushed", ["at sent-update", "within the send"])
def test_an_aggregate_pushed_before_apply_update_reaches_a_strict_bridge(
    assets_dir: Path, short_tmp: Path, pushed: str
) -> None:
    """The parameter server pushes as soon as it has the round's last update: when
    `sent-update` tells the scheduler it is in, or, when ours is that last update, while our
    send is still in flight. Both come before the scheduler's `apply-update`, and the
    receive opened with the send takes them."""
    source = peers([PS], "All")
    statuses_seen: list[str] = []

    def push_and_wait_for_the_bridge() -> None:
        pushed_seq = backend.push(zero_update(assets_dir))
        # Returns once the bridge has the push and has answered a receive with it.
        until(lambda: backend.handed >= pushed_seq and bridge.receives_answered() >= 1)

    def script(details: dict[str, Any]) -> Action:
        statuses_seen.append(details["state"])
        match details["state"]:
            case "joined":
                return ExecuteBatch(2)
            case "batch-completed":
                return SendUpdate(peers([PS], "One"), 1.0)
            case "sent-update":
                if pushed == "at sent-update":
                    push_and_wait_for_the_bridge()
                return ApplyUpdate(source, later(5))
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        if pushed == "within the send":
            backend.on_send = push_and_wait_for_the_bridge
        process = run_executor(job_json, bridge)
        _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert statuses_seen == ["joined", "batch-completed", "sent-update", "applied-update"], err


@pytest.mark.slow
@pytest.mark.parametrize("pushed", ["before execute-batch", "after execute-batch"])
def test_an_aggregate_pushed_without_apply_update_is_applied_in_its_round(
    assets_dir: Path, short_tmp: Path, pushed: str
) -> None:
    """Upstream's order: the parameter server reports `broadcasted-update` once the push is
    on our bridge, and its scheduler then answers our `idle` with `execute-batch`, never
    `apply-update`. The held aggregate is applied before that batch (round 1 is counted in
    the next `sent-update`); the next round's aggregate, in the older order (`apply-update`),
    is applied too, not the previous one's file."""
    source = peers([PS], "All")
    sends = 0

    def push_later() -> None:
        time.sleep(0.5)  # the batch's answer is on its way first
        backend.push(zero_update(assets_dir))

    def script(details: dict[str, Any]) -> Action:
        nonlocal sends
        match details["state"]:
            case "joined":
                return ExecuteBatch(2)
            case "batch-completed":
                return SendUpdate(peers([PS], "One"), 1.0)
            case "sent-update" if sends == 0:
                sends = 1
                if pushed == "before execute-batch":
                    seq = backend.push(zero_update(assets_dir))
                    until(lambda: backend.handed >= seq)
                else:
                    threading.Thread(target=push_later, daemon=True).start()
                return ExecuteBatch(1)
            case "sent-update":
                sends = 2
                backend.push(zero_update(assets_dir))
                return ApplyUpdate(source, later(30))
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        process = run_executor(job_json, bridge)
        out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    states = [d["state"] for d in backend.statuses]
    assert states == [
        "joined", "batch-completed", "sent-update", "batch-completed", "sent-update",
        "applied-update",
    ], err  # fmt: skip
    # The second update is round 2's: round 1's aggregate was applied before its batch.
    assert [d["round"] for d in backend.statuses if d["state"] == "sent-update"] == [0, 1]
    assert "terminated by the scheduler after 2 round(s)" in out, out


@pytest.mark.slow
def test_a_round_aggregated_without_our_update_is_applied_while_we_train(
    assets_dir: Path, short_tmp: Path
) -> None:
    """Upstream's quorum and grace time: a round can be aggregated while we still train, our
    update not in it, and its parameter server pushes the aggregate at once; upstream's
    worker refuses a push no open receive takes (the bridge here is strict). The receive
    opened with our first send is kept open, so that aggregate is taken while we train and
    applied before our next batch; the update we send next is round 3's, and the round
    after it is applied on `apply-update` as usual."""
    source = peers([PS], "All")
    sends = 0
    straggling = False

    def within(seconds: float, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)

    def push_at_once() -> None:
        # The receive a moment ago's action left open, if any, is given time to be on the
        # bridge; on a strict bridge a push with none open is dropped, not waited for.
        within(5, lambda: bridge.receives_open() > 0)
        answered = bridge.receives_answered()
        seq = backend.push(zero_update(assets_dir))
        until(lambda: backend.handed >= seq)
        within(5, lambda: bridge.receives_answered() > answered)

    def script(details: dict[str, Any]) -> Action:
        nonlocal sends, straggling
        match details["state"]:
            case "joined":
                return ExecuteBatch(2)
            case "batch-completed" if sends == 1 and not straggling:
                straggling = True
                push_at_once()  # round 2, aggregated at a quorum without us
                return ExecuteBatch(1)
            case "batch-completed":
                return SendUpdate(peers([PS], "One"), 1.0)
            case "sent-update" if sends == 0:
                sends = 1
                push_at_once()  # round 1's aggregate, without apply-update
                return ExecuteBatch(1)
            case "sent-update":
                sends = 2
                push_once_receiving(bridge, backend, zero_update(assets_dir))
                return ApplyUpdate(source, later(30))
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        process = run_executor(job_json, bridge)
        out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    states = [d["state"] for d in backend.statuses]
    assert states == [
        "joined", "batch-completed", "sent-update", "batch-completed", "batch-completed",
        "sent-update", "applied-update",
    ], err  # fmt: skip
    assert [d["round"] for d in backend.statuses if d["state"] == "sent-update"] == [0, 2], err
    assert "round 2's aggregate came without our update" in out, out
    assert "terminated by the scheduler after 3 round(s)" in out, out


@pytest.mark.slow
def test_an_update_lacking_tensors_is_said_every_round(assets_dir: Path, short_tmp: Path) -> None:
    """A parameter server leaves out the tensors its peers sent in another dtype: an
    aggregate with some of the model's tensors, or none, is applied, and said each round."""
    full = load(zero_update(assets_dir))
    kept = dict(list(full.items())[: len(full) // 2])
    updates = iter([save(kept), save({})])
    source = peers([PS], "All")
    applied = 0

    def script(details: dict[str, Any]) -> Action:
        nonlocal applied
        applied += details["state"] == "applied-update"
        match details["state"]:
            case "joined" | "applied-update" if applied < 2:
                return ExecuteBatch(1)
            case "batch-completed":
                return SendUpdate(peers([PS], "One"), 1.0)
            case "sent-update":
                push_once_receiving(bridge, backend, next(updates))
                return ApplyUpdate(source, later(30))
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        process = run_executor(job_json, bridge)
        out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    # In the log (stdout): the later releases' runtime keeps no stderr.
    warnings = [line for line in out.splitlines() if "update held" in line]
    assert warnings == [
        f"warning: round 1's update held {len(kept)} of {len(full)} tensors; the others did "
        "not move (does every peer send the same dtype? HYPHA_PSEUDO_GRADIENT_DTYPE)",
        f"warning: round 2's update held 0 of {len(full)} tensors; the others did not move "
        "(does every peer send the same dtype? HYPHA_PSEUDO_GRADIENT_DTYPE)",
    ], err
