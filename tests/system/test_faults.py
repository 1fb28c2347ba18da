"""The fault table of issue 35 as tests: a worker's bridge answers a route the way upstream's
does when its remote side is unreachable for a moment (the stand-in's faults on demand,
standin/worker/faults.py), on both generations, with the stand-in's tiny model. Each job
finishes, and nothing is lost: the batches the worker trained are those counted in its sent
updates, and it reports a loss for every round."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from action_bridges import (
    PS,
    action_bridge,
    push_once_receiving,
    run_executor,
    until,
    zero_update,
)
from hypha.accelerate_executor.errors import UsageError
from hypha.accelerate_executor.protocol.actions.messages import (
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    SendUpdate,
    Terminate,
)
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.standin.actions.scheduler import peers
from hypha.standin.coordinator.server import RunOptions
from hypha.standin.demo import run_demo
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.faults import Fault, FaultPlan, parse_fault

ROUNDS = 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("generation", "fault"),
    [
        ("actions", "/action/update=500:network_error:1"),
        ("actions", "/resources/fetch=500:io_error:1"),
        ("actions", "/resources/send=500:connector_error:1"),
        ("alpha17", "/status/send=500:network_error:1"),
        ("alpha17", "/resources/fetch=500:io_error:1"),
        ("alpha17", "/resources/send=500:connector_error:1"),
        ("actions", "/resources/fetch=400:hash_mismatch:1"),
        ("alpha17", "/resources/fetch=400:hash_mismatch:1"),
        ("actions", "/resources/fetch=truncated:1"),
        ("alpha17", "/resources/fetch=truncated:1"),
        ("actions", "/resources/receive=busy:1"),
        ("alpha17", "/resources/receive=cut:1"),
    ],
)
def test_a_transient_fault_costs_a_retry_not_the_job(
    assets_dir: Path,
    tmp_path: Path,
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    generation: str,
    fault: str,
) -> None:
    options = RunOptions(workers=2, rounds=ROUNDS, steps_per_round=20, generation=generation)  # type: ignore[arg-type]
    code = run_demo(
        options, preset("process"), out_dir=tmp_path / "out", work_base=short_tmp,
        assets_dir=assets_dir, timeout_s=600, faults=(parse_fault(fault),),
    )  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 0, summary["reasons"]
    route = fault.partition("=")[0]
    assert f"[w1 bridge] fault on demand: {route} " in capsys.readouterr().out
    faulty = summary["workers"]["w1"]
    assert faulty["exit_code"] == 0
    # A loss for every round, from updates that each carry batches (the action protocol's
    # exact count of batches against updates is the scripted test below).
    rounds = {int(key): metrics for key, metrics in faulty["metrics"].items()}
    assert len(rounds) == ROUNDS  # numbered from 0 on actions, from 1 on alpha.17
    assert all(m["loss"] > 0 and m["batches"] > 0 for m in rounds.values())
    if generation == "alpha17":  # the scheduler counted one status per batch trained
        assert faulty["batches_trained"] == faulty["batches_reported"]
    # The row's figures, for docs/faults.md's table (shown with -rA).
    losses = " ".join(f"{rounds[r]['loss']:.2f}" for r in sorted(rounds))
    batches = [int(rounds[r]["batches"]) for r in sorted(rounds)]
    counts = f", trained {faulty['batches_trained']}, counted {faulty['batches_reported']}"
    print(f"ROW {generation} {fault}: w1 losses {losses}, batches per update {batches}"
          f"{counts if generation == 'alpha17' else ''}")  # fmt: skip


@pytest.mark.slow
def test_a_failed_send_loses_no_batch_and_no_loss(assets_dir: Path, short_tmp: Path) -> None:
    """The update's send fails for good (a final 400 here, to reach the executor's error
    path without waiting out the retry bound, which is the same path): `error{connection}`,
    the scheduler has more batches trained and asks for the update again; the sent update
    that goes through counts every batch trained since the last one, with their loss, and
    the failed send's file is gone from the work dir."""
    statuses: list[dict[str, Any]] = []

    def script(details: dict[str, Any]) -> Any:
        statuses.append(details)
        match details["state"], sum(s["state"] == "error" for s in statuses):
            case "joined", _:
                return ExecuteBatch(3)
            case "batch-completed", _:
                return SendUpdate(peers([PS], "One"), 1.0)
            case "error", 1:
                return ExecuteBatch(2)
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        bridge.faults = FaultPlan((Fault("/resources/send", 400, "invalid_request", 1),))
        process = run_executor(job_json, bridge)
        _, err = process.communicate(timeout=300)
        left = sorted(p.name for p in (bridge.work_dir / "pseudo-gradients").glob("*"))
    assert process.returncode == 0, err
    states = [s["state"] for s in statuses]
    assert states == [
        "joined", "batch-completed", "error", "batch-completed", "sent-update"
    ], err  # fmt: skip
    assert statuses[2]["type"] == "connection"
    metrics = statuses[-1]["metrics"]
    assert metrics["batches"] == 3 + 2 and metrics["loss"] > 0
    assert len(backend.sent) == 1 and left == []


@pytest.mark.slow
def test_a_peer_killed_mid_round_the_others_finish_and_a_replacement_gets_the_model(
    assets_dir: Path, tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Worker 1's executor is killed as it sends its first update (`/resources/send=kill`):
    worker 2 trains every round on, and a replacement that joins after round 1 starts from
    a peer's model. The run's verdict is a failure, since one executor died: that is what
    happened."""
    options = RunOptions(
        workers=2, late_workers=1, rounds=ROUNDS, steps_per_round=20, generation="actions"
    )
    run_demo(
        options, preset("process"), out_dir=tmp_path / "out", work_base=short_tmp,
        assets_dir=assets_dir, timeout_s=600, faults=(parse_fault("/resources/send=kill"),),
    )  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    out = capsys.readouterr().out
    assert "[w1 bridge] fault on demand: /resources/send killed the executor" in out
    workers = summary["workers"]
    assert workers["w1"]["exit_code"] == 137 and workers["w1"]["metrics"] == {}
    survivor = {int(key): m for key, m in workers["w2"]["metrics"].items()}
    assert workers["w2"]["exit_code"] == 0 and sorted(survivor) == list(range(ROUNDS))
    assert survivor[ROUNDS - 1]["loss"] < survivor[0]["loss"]
    assert workers["w3"]["exit_code"] == 0 and "[w3] received the model from a peer" in out


@pytest.mark.slow
def test_the_schedulers_own_error_ends_the_job_cleanly(
    assets_dir: Path, tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upstream's scheduler answers a request it failed to handle with a gymnasium
    `terminate`: worker 1's bridge passes that answer on mid-round (its 40th update), and
    the executor ends the job in one line, exit 0, as the scheduler asked, not as a failure
    of its own. Worker 2 trains on."""
    options = RunOptions(workers=2, rounds=ROUNDS, steps_per_round=20, generation="actions")
    run_demo(
        options, preset("process"), out_dir=tmp_path / "out", work_base=short_tmp,
        assets_dir=assets_dir, timeout_s=600,
        faults=(parse_fault("/action/update=scheduler-error:40"),),
    )  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    out = capsys.readouterr().out
    assert "[w1 bridge] fault on demand: /action/update answered 200 scheduler-error" in out
    assert "[w1] the scheduler ended the job: it failed handling our request" in out
    workers = summary["workers"]
    assert workers["w1"]["exit_code"] == 0 and workers["w1"]["violations"] == []
    assert workers["w2"]["exit_code"] == 0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("/resources/send=500", "expected ROUTE=STATUS:ERROR"),
        ("/nope=500:network_error", "the route is not one of"),
        ("/status/send=200:fine", "STATUS is 4xx or 5xx"),
        ("/status/send=500:network_error:0", "TIMES at least 1"),
        ("/status/send=5xx:network_error", "whole numbers"),
        ("/resources/send=busy", "busy is a fault of /resources/receive only"),
        ("/resources/receive=truncated", "truncated is a fault of /resources/fetch only"),
        ("/resources/receive=slow", r"expected /resources/receive=slow:SECONDS\[:TIMES\]"),
        ("/resources/receive=slow:soon", "SECONDS is a number"),
        ("/resources/receive=busy:1:2", r"expected /resources/receive=busy\[:TIMES\]"),
        ("/status/send=scheduler-error", "scheduler-error is a fault of /action/update only"),
        ("/action/update=scheduler-error:x", r"scheduler-error\[:AFTER\], AFTER a count"),
    ],
)
def test_a_fault_written_wrong_is_refused_by_name(text: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        parse_fault(text)


def test_faults_count_down_per_route() -> None:
    plan = FaultPlan(
        (parse_fault("/status/send=500:network_error:2"), parse_fault("/action/update=kill"))
    )
    taken = [plan.take("/status/send") for _ in range(3)]
    assert [fault and fault.status for fault in taken] == [500, 500, None]
    kill = plan.take("/action/update")
    assert kill is not None and kill.kills and plan.take("/action/update") is None
    assert plan.take("/resources/fetch") is None
    # A truncated fetch is a data slice's: a model's fetch neither gets nor spends it.
    plan = FaultPlan((parse_fault("/resources/fetch=truncated"),))
    assert plan.take("/resources/fetch") is None
    truncated = plan.take("/resources/fetch", data_slice=True)
    assert truncated is not None and truncated.served
    assert plan.take("/resources/fetch", data_slice=True) is None
    slow = parse_fault("/resources/receive=slow:2.5:3")
    assert (slow.seconds, slow.times, slow.served) == (2.5, 3, True)
    # A scheduler error comes after AFTER requests served, once.
    plan = FaultPlan((parse_fault("/action/update=scheduler-error:2"),))
    taken = [plan.take("/action/update") for _ in range(4)]
    assert [fault and fault.error for fault in taken] == [None, None, "scheduler-error", None]


def bridge_client(bridge: Any, job_json: str) -> ActionBridgeClient:
    return ActionBridgeClient(bridge.socket_path, bridge.work_dir, json.loads(job_json)["job_id"])


def test_a_push_streaming_past_its_receives_deadline_is_received(
    assets_dir: Path, short_tmp: Path
) -> None:
    """Upstream's bridge stops a receive's idle timer once data flows: a push that starts
    before the deadline and streams for longer is answered after it. The receive waits for
    as long as its directory is being written, not only for the deadline and its slack."""
    with action_bridge(assets_dir, short_tmp / "work", lambda _: Terminate()) as (
        job_json, bridge, backend,
    ):  # fmt: skip
        bridge.faults = FaultPlan((parse_fault("/resources/receive=slow:3"),))
        client = bridge_client(bridge, job_json)
        client.receive_slack_s = 1.0  # the file takes 3 s: past the deadline and the slack
        push_once_receiving(bridge, backend, b"a model over a slow link" * 1000)
        received = client.receive_one(peers([PS], "All"), "incoming", time.time() + 0.5)
    assert received is not None and received.from_peer == PS
    assert received.path.read_bytes() == b"a model over a slow link" * 1000


def test_a_receive_refused_at_once_is_asked_again_until_one_is_registered(
    assets_dir: Path, short_tmp: Path
) -> None:
    """Upstream's connector holds one receive registration at a time; a receive it cannot
    register is answered 204 at once, long before its deadline. That is no "nothing came":
    the receive is asked again after a pause until its deadline."""
    with action_bridge(assets_dir, short_tmp / "work", lambda _: Terminate()) as (
        job_json, bridge, backend,
    ):  # fmt: skip
        bridge.faults = FaultPlan((parse_fault("/resources/receive=busy:2"),))
        client = bridge_client(bridge, job_json)
        push_once_receiving(bridge, backend, b"an aggregate")
        received = client.receive_one(peers([PS], "All"), "incoming", time.time() + 60)
        assert bridge.faults.take("/resources/receive") is None  # both 204s were answered
    assert received is not None and received.path.read_bytes() == b"an aggregate"


@pytest.mark.slow
def test_a_truncated_cached_slice_is_fetched_again_and_trained_once_whole(
    assets_dir: Path, short_tmp: Path
) -> None:
    """Upstream's bridge returns a slice cached in `artifacts/` unchecked, so a download that
    broke off hands out a truncated slice (the stand-in plays it). The executor deletes it,
    fetches another, and trains; the sent update counts exactly the batches trained."""
    statuses: list[dict[str, Any]] = []

    def script(details: dict[str, Any]) -> Any:
        statuses.append(details)
        match details["state"]:
            case "joined":
                return ExecuteBatch(3)
            case "batch-completed":
                return SendUpdate(peers([PS], "One"), 1.0)
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, _):
        bridge.faults = FaultPlan((parse_fault("/resources/fetch=truncated:1"),))
        process = run_executor(job_json, bridge)
        _, err = process.communicate(timeout=300)
        # Slices are cached by their hash, a number; the model's files are there too.
        cached = [p.name for p in (bridge.work_dir / "artifacts").glob("*") if p.name.isdigit()]
    assert process.returncode == 0, err
    assert "deleted it, fetching again" in err
    assert [s["state"] for s in statuses] == ["joined", "batch-completed", "sent-update"]
    assert statuses[-1]["metrics"]["batches"] == 3 and statuses[-1]["metrics"]["loss"] > 0
    assert cached == []  # every slice moved out of the bridge's cache, the broken one deleted


@pytest.mark.slow
@pytest.mark.parametrize("skew_s", [-300.0, 300.0])
def test_a_scheduler_clock_minutes_off_neither_hangs_nor_loses_the_aggregate(
    assets_dir: Path, short_tmp: Path, skew_s: float
) -> None:
    """Deadlines are the scheduler's wall clock, read by the worker with its own. A
    scheduler 5 minutes behind sends deadlines already past: the executor opens no receive
    with one (upstream's bridge would wait for ever), waits nothing, and still applies the
    aggregate, which its standing receive (deadline of its own clock) took. A scheduler 5
    minutes ahead makes `apply-update` wait no longer than the file takes: it is there."""

    def skewed(seconds: float) -> float:
        return time.time() + skew_s + seconds

    def script(details: dict[str, Any]) -> Any:
        match details["state"]:
            case "joined":
                return ExecuteBatch(2)
            case "batch-completed":
                return SendUpdate(peers([PS], "One"), 1.0)
            case "sent-update":
                seq = backend.push(zero_update(assets_dir))
                until(lambda: backend.handed >= seq and bridge.receives_answered() >= 1)
                return ApplyUpdate(peers([PS], "All"), skewed(5))
            case "error" | "idle" if len(backend.statuses) < 40:
                # The standing receive's answer may still be on its way: `idle`, then again.
                return (
                    Idle(skewed(0.2))
                    if details["state"] == "error"
                    else ApplyUpdate(peers([PS], "All"), skewed(5))
                )
        return Terminate()

    with action_bridge(assets_dir, short_tmp / "work", script) as (job_json, bridge, backend):
        process = run_executor(job_json, bridge)
        _, err = process.communicate(timeout=300)
    states = [s["state"] for s in backend.statuses]
    assert process.returncode == 0, err
    assert states[-1] == "applied-update" and "sent-update" in states, states
