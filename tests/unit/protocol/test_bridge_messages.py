"""The bridge's messages are declared once (protocol/messages.py, protocol/alpha17/messages.py, protocol/actions/messages.py,
bridge/client.py): what one side writes through a declaration, the other reads back through
it unchanged, and the wire is upstream's spelling, pinned here in literals."""

from __future__ import annotations

import json
import time

import pytest

from hypha.accelerate_executor.errors import SerdeError
from hypha.accelerate_executor.protocol.actions.messages import (
    ACTION_RECEIVE_REQUEST,
    ACTION_REQUEST,
    ACTION_SEND_REQUEST,
    IDLE,
    Action,
    ActionReceiveRequest,
    ActionSendRequest,
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    PushToHub,
    ReceiveModel,
    SendModel,
    SendUpdate,
    Status,
    SystemTime,
    Terminate,
    WaitForModel,
    action_request,
    action_response,
    batch_completed,
    error_status,
    parse_action_response,
    sent_update,
)
from hypha.accelerate_executor.protocol.alpha17.job import PeersReference
from hypha.accelerate_executor.protocol.alpha17.messages import (
    PROGRESS,
    RECEIVE_REQUEST,
    SEND_REQUEST,
    Continue,
    Done,
    Error,
    Ok,
    ReceiveRequest,
    SchedulerAnswer,
    ScheduleUpdate,
    SendRequest,
    answer_body,
    batch_status,
    parse_answer,
    round_metrics,
)
from hypha.accelerate_executor.protocol.job import Strategy
from hypha.accelerate_executor.protocol.messages import wire
from hypha.accelerate_executor.protocol.serde_json import from_python
from hypha.standin.actions.scheduler import peers

JOB_ID = "0b7f3c52-9a1e-4c55-8d2a-3f6e1b9d4a10"
PS = "12D3KooWJ6MBkbH3o7j2yhhDAF7gRxA4Zm5cpuEUr2Znp1VvNBw3"
AT = 1_700_000_000.25  # exact in binary, so a SystemTime round trip is too

ACTIONS: list[Action] = [
    Idle(AT),
    WaitForModel(AT),
    ReceiveModel(peers([PS], "All"), AT),
    SendModel(peers([PS], "One")),
    ExecuteBatch(3),
    ExecuteBatch(1, 0.5),
    SendUpdate(peers([PS], "One"), 0.25),
    ApplyUpdate(peers([PS], "All"), AT),
    PushToHub("hf/repo", "token"),
    Terminate(),
]


def json_round_trip(value: object) -> object:
    return json.loads(json.dumps(value, allow_nan=False))


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: type(a).__name__)
def test_an_action_the_stand_in_writes_is_the_one_the_executor_reads(action: Action) -> None:
    wire = json_round_trip(action_response(JOB_ID, action))
    assert parse_action_response(wire, JOB_ID) == action


def test_an_action_is_spelled_as_upstreams() -> None:
    assert action_response(JOB_ID, ApplyUpdate(peers([PS], "All"), AT)) == {
        "job_id": JOB_ID,
        "next": {
            "executor": "train",
            "action": {
                "kind": "apply-update",
                "source": {
                    "type": "peers",
                    "peers": [PS],
                    "strategy": {"type": "All"},
                    "resource": None,
                },
                "timeout": {"secs_since_epoch": 1_700_000_000, "nanos_since_epoch": 250_000_000},
            },
        },
    }


def test_a_deadline_never_carries_a_whole_second_of_nanos() -> None:
    assert SystemTime.at(1.9999999999) == SystemTime(secs_since_epoch=2, nanos_since_epoch=0)


STATUSES: list[Status] = [
    IDLE,
    batch_completed(8, 0),
    sent_update(2, {"loss": 1.5, "skipped": float("nan")}),
    error_status("connection", "the\n bridge   went away"),
]


@pytest.mark.parametrize("status", STATUSES, ids=lambda s: s.state)
def test_a_status_the_executor_writes_is_the_one_the_stand_in_reads(status: Status) -> None:
    request = ACTION_REQUEST.validate_python(json_round_trip(action_request(JOB_ID, status)))
    assert request.job_id == JOB_ID and request.status.details == status


def test_a_status_is_spelled_as_upstreams() -> None:
    assert action_request(JOB_ID, sent_update(2, {"loss": 1.5, "skipped": float("nan")})) == {
        "job_id": JOB_ID,
        "status": {
            "executor": "train",
            "details": {"state": "sent-update", "round": 2, "metrics": {"loss": 1.5}},
        },
    }


ANSWERS: list[SchedulerAnswer] = [Ok(), Continue(), ScheduleUpdate(4), Done(), Error()]


@pytest.mark.parametrize("answer", ANSWERS, ids=lambda a: type(a).__name__)
def test_an_answer_the_stand_in_writes_is_the_one_the_executor_reads(
    answer: SchedulerAnswer,
) -> None:
    assert parse_answer(json_round_trip(answer_body(answer))) == answer


def test_progress_is_spelled_as_upstreams_and_read_back() -> None:
    written = [
        (batch_status(8), {"status": {"batch_size": 8}}),
        (
            round_metrics(1, {"loss": 2.0}),
            {"metrics": {"round": 1, "metrics": {"loss": 2.0}}},
        ),
        ("update", "update"),
    ]
    assert answer_body(ScheduleUpdate(4)) == {"type": "ScheduleUpdate", "counter": 4}
    for progress, on_wire in written:
        assert PROGRESS.dump_python(progress) == on_wire
        assert PROGRESS.validate_python(on_wire) == progress


def test_the_request_bodies_the_client_writes_are_what_the_stand_ins_serde_reads() -> None:
    alpha17 = PeersReference(type="peers", peers=[PS], strategy=Strategy(type="All"))
    action_era = peers([PS], "All")
    deadline = time.time() + 60
    written = [
        (SEND_REQUEST, SendRequest(resource=alpha17, path="update.safetensors")),
        (RECEIVE_REQUEST, ReceiveRequest(resource=alpha17, path="incoming")),
        (
            ACTION_SEND_REQUEST,
            ActionSendRequest(resource=action_era, path="u.safetensors", remove_file=True),
        ),
        (
            ACTION_RECEIVE_REQUEST,
            ActionReceiveRequest(
                resource=action_era, path="incoming", timeout=SystemTime.at(deadline)
            ),
        ),
    ]
    for serde, body in written:
        on_wire = json_round_trip(wire(body))
        assert serde.decode(from_python(on_wire), ()) == on_wire
        assert type(body).model_validate(on_wire) == body
    # What serde refuses: a send without `remove_file` to an action-era bridge.
    with pytest.raises(SerdeError, match="remove_file"):
        ACTION_SEND_REQUEST.decode(from_python({"resource": wire(action_era), "path": "x"}), ())


def test_a_batch_completed_without_batches_reads_as_one_batch() -> None:
    """The earlier form, which upstream's own accelerate executor still reports."""
    body = {"executor": "train", "details": {"state": "batch-completed", "batch_size": 8}}
    request = ACTION_REQUEST.validate_python({"job_id": JOB_ID, "status": body})
    assert request.status.details == batch_completed(8, 1)
