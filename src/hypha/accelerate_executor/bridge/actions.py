"""The action protocol's messages (docs/protocol-actions.md): what a train executor reports to
`POST /action/update`, and the action the scheduler answers with.

Upstream's types (crates/messages/src/lib.rs @3058282936, module `action`): a request is
`{"job_id", "status": {"executor": "train", "details": {"state": ..., fields}}}`, an answer
`{"job_id", "next": {"executor": "train", "action": {"kind": ..., fields}}}`; deadlines are
serde's SystemTime, `{"secs_since_epoch", "nanos_since_epoch"}`, absolute. Answers are read
strictly here, once, into the typed actions below; the earlier forms of `execute-batch`
(without `batches`, or with `lr_multiplier`) are accepted as one batch. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hypha.accelerate_executor.errors import SchedulerError
from hypha.accelerate_executor.spec.job import ActionPeersReference

# Statuses: what the executor reports.


@dataclass(frozen=True)
class Status:
    """One train status: its `state` and that state's fields, as upstream's TrainStatus."""

    state: str
    fields: dict[str, Any] = field(default_factory=dict)

    def wire(self, job_id: str) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "status": {"executor": "train", "details": {"state": self.state, **self.fields}},
        }


JOINED = Status("joined")
IDLE = Status("idle")
APPLIED_UPDATE = Status("applied-update")
SENT_MODEL = Status("sent-model")
RECEIVED_MODEL = Status("received-model")
WAITED_FOR_MODEL = Status("waited-for-model")


def batch_completed(batch_size: int, batches: int) -> Status:
    # `batches` always beside `batch_size`: the newest types require it, older ones ignore it.
    return Status("batch-completed", {"batch_size": batch_size, "batches": batches})


def sent_update(round_number: int, metrics: dict[str, float]) -> Status:
    # The scheduler's metrics are f32, and JSON has no NaN: only finite values go.
    finite = {name: value for name, value in metrics.items() if math.isfinite(value)}
    return Status("sent-update", {"round": round_number, "metrics": finite})


def error_status(kind: str, message: str) -> Status:
    """`connection` for the bridge and the network, `other` for the rest."""
    assert kind in ("connection", "other")
    return Status("error", {"type": kind, "message": " ".join(message.split())[:500]})


# Actions: what the scheduler answers. Deadlines are seconds since the epoch (time.time()).


@dataclass(frozen=True)
class Idle:
    deadline: float


@dataclass(frozen=True)
class WaitForModel:
    deadline: float


@dataclass(frozen=True)
class ReceiveModel:
    source: ActionPeersReference
    deadline: float


@dataclass(frozen=True)
class SendModel:
    target: ActionPeersReference


@dataclass(frozen=True)
class ExecuteBatch:
    batches: int
    lr_multiplier: float | None = None  # a branch's variant (cc1d315c); see docs


@dataclass(frozen=True)
class SendUpdate:
    target: ActionPeersReference
    weight: float


@dataclass(frozen=True)
class ApplyUpdate:
    source: ActionPeersReference
    deadline: float


@dataclass(frozen=True)
class PushToHub:
    repository: str
    token: str = field(repr=False)  # never in a log line


@dataclass(frozen=True)
class Terminate:
    pass


Action = (
    Idle
    | WaitForModel
    | ReceiveModel
    | SendModel
    | ExecuteBatch
    | SendUpdate
    | ApplyUpdate
    | PushToHub
    | Terminate
)


def system_time(seconds: float) -> dict[str, int]:
    """serde's SystemTime for `seconds` since the epoch."""
    whole = math.floor(seconds)
    return {"secs_since_epoch": whole, "nanos_since_epoch": round((seconds - whole) * 1e9)}


class _Fields:
    """An action's fields, each read once with its type checked; the answer quoted in no
    message (a push-to-hub carries a token)."""

    def __init__(self, kind: str, body: dict[str, Any]) -> None:
        self.kind, self.body = kind, body

    def fail(self, what: str) -> SchedulerError:
        return SchedulerError(f"the scheduler's {self.kind!r} action: {what}")

    def deadline(self, name: str = "timeout") -> float:
        value = self.body.get(name)
        if not isinstance(value, dict):
            raise self.fail(f"`{name}` is not a SystemTime")
        secs, nanos = value.get("secs_since_epoch"), value.get("nanos_since_epoch")
        if type(secs) is not int or type(nanos) is not int or secs < 0 or not 0 <= nanos < 10**9:
            raise self.fail(f"`{name}` is not a SystemTime")
        return secs + nanos / 1e9

    def peers(self, name: str) -> ActionPeersReference:
        try:
            return ActionPeersReference.model_validate(self.body.get(name))
        except ValidationError:
            raise self.fail(f"`{name}` is not a peers reference") from None

    def u32(self, name: str, default: int) -> int:
        value = self.body.get(name, default)
        if type(value) is not int or not 0 <= value < 2**32:
            raise self.fail(f"`{name}` is not a u32")
        return value

    def number(self, name: str) -> float:
        value = self.body.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"`{name}` is not a number")
        return float(value)

    def text(self, name: str) -> str:
        value = self.body.get(name)
        if not isinstance(value, str):
            raise self.fail(f"`{name}` is not a string")
        return value


def parse_action_response(value: Any, job_id: str) -> Action:
    """The ActionResponse's action, or SchedulerError naming what is wrong with it."""
    if not isinstance(value, dict) or not isinstance(value.get("next"), dict):
        raise SchedulerError("the scheduler's answer is not an ActionResponse")
    if value.get("job_id") != job_id:
        raise SchedulerError("the scheduler answered for another job")
    next_ = value["next"]
    if next_.get("executor") != "train":
        # rl_scheduler answers an internal error with a gymnasium `terminate`.
        raise SchedulerError(
            f"the scheduler sent an action for a {next_.get('executor')!r} executor"
        )
    body = next_.get("action")
    kind = body.get("kind") if isinstance(body, dict) else None
    if not isinstance(kind, str) or not isinstance(body, dict):
        raise SchedulerError("the scheduler's action has no kind")
    fields = _Fields(kind, body)
    if kind == "idle":
        return Idle(fields.deadline())
    if kind == "wait-for-model":
        return WaitForModel(fields.deadline())
    if kind == "receive-model":
        return ReceiveModel(fields.peers("source"), fields.deadline())
    if kind == "send-model":
        return SendModel(fields.peers("target"))
    if kind == "execute-batch":
        # Older schedulers send no `batches` (one batch); a branch sends `lr_multiplier`.
        multiplier = fields.number("lr_multiplier") if "lr_multiplier" in body else None
        return ExecuteBatch(fields.u32("batches", 1), multiplier)
    if kind == "send-update":
        # An older `timeout` field is ignored: the send itself is synchronous.
        return SendUpdate(fields.peers("target"), fields.number("weight"))
    if kind == "apply-update":
        return ApplyUpdate(fields.peers("source"), fields.deadline())
    if kind == "push-to-hub":
        return PushToHub(fields.text("repository"), fields.text("token"))
    if kind == "terminate":
        return Terminate()
    raise SchedulerError(f"the scheduler sent an unknown action {kind!r}")
