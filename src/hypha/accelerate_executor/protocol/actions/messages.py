"""The action protocol's messages (docs/protocol-actions.md): the send and receive bodies, what a
train executor reports to `POST /action/update`, and the action the scheduler answers with.

Upstream's types (crates/messages/src/lib.rs @3058282936, module `action`): a request is
`{"job_id", "status": {"executor": "train", "details": {"state": ..., fields}}}`, an answer
`{"job_id", "next": {"executor": "train", "action": {"kind": ..., fields}}}`; deadlines are
serde's SystemTime, `{"secs_since_epoch", "nanos_since_epoch"}`, absolute. Answers are read
strictly here, once, into the typed actions below; the earlier forms of `execute-batch`
(without `batches`, or with `lr_multiplier`) are accepted as one batch, and so is a
`batch-completed` without `batches`. Torch-free.

Declared once for both sides: the executor writes statuses and reads actions through what is
here, the local stand-in reads statuses (its bridge refusing what serde refuses) and writes
actions through the same declarations (standin/scheduler, standin/coordinator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, StrictStr, TypeAdapter, ValidationError

from hypha.accelerate_executor.errors import SchedulerError
from hypha.accelerate_executor.protocol.actions.job import (
    ACTION_REFERENCE,
    ActionPeersReference,
    ActionReference,
)
from hypha.accelerate_executor.protocol.messages import (
    DEFAULT_RECEIVE_DIR,
    U32,
    Metrics,
    Shape,
    wire,
)
from hypha.accelerate_executor.protocol.serde import Default, Integer, Str, Tagged, struct

ACTION_ROUTE = "/action/update"

# The bridge's send and receive (bridge.rs @3058282936): send is synchronous and requires
# `remove_file`; receive waits for one file until `timeout`, an absolute SystemTime. The
# reference is read straight from the body: string tags only.
ACTION_BODY_REFERENCE = Tagged(ACTION_REFERENCE.tag, ACTION_REFERENCE.variants, index_tags=False)


class SystemTime(Shape):
    """serde's SystemTime: since the epoch."""

    secs_since_epoch: Annotated[int, Integer("u64")]
    nanos_since_epoch: Annotated[int, Integer("u32")]

    @classmethod
    def at(cls, seconds: float) -> SystemTime:
        whole = math.floor(seconds)  # the fraction is exact; seconds x 1e9 would not be
        carry, nanos = divmod(round((seconds - whole) * 1e9), 10**9)
        return cls(secs_since_epoch=whole + carry, nanos_since_epoch=nanos)

    @property
    def seconds(self) -> float:
        return self.secs_since_epoch + self.nanos_since_epoch / 1e9


class ActionSendRequest(Shape):
    resource: Annotated[ActionReference, ACTION_BODY_REFERENCE]
    path: str
    remove_file: bool


class ActionReceiveRequest(Shape):
    resource: Annotated[ActionReference, ACTION_BODY_REFERENCE]
    path: Annotated[str, Default(Str())] = DEFAULT_RECEIVE_DIR
    timeout: Annotated[SystemTime | None, Default(struct(SystemTime))] = None


ACTION_SEND_REQUEST = struct(ActionSendRequest)
ACTION_RECEIVE_REQUEST = struct(ActionReceiveRequest)

# Statuses: what the executor reports, upstream's TrainStatus variants.


class UnitStatus(Shape):
    state: Literal[
        "joined", "idle", "applied-update", "pushed-to-hub", "sent-model", "received-model",
        "waited-for-model", "terminated",
    ]  # fmt: skip


class BatchCompletedStatus(Shape):
    state: Literal["batch-completed"]
    batch_size: U32
    # The earlier form, `{batch_size}` alone, is read as one batch, as the train scheduler of
    # that form counted it (`batch_scheduler.rs`, index id 66537813103): upstream's own
    # accelerate executor still reports it (training.py, index id 66429791419).
    batches: U32 = 1


class SentUpdateStatus(Shape):
    state: Literal["sent-update"]
    round: U32
    metrics: Metrics


class ErrorStatus(Shape):
    state: Literal["error"]
    type: Literal["connection", "other"]
    message: StrictStr


Status = Annotated[
    UnitStatus | BatchCompletedStatus | SentUpdateStatus | ErrorStatus,
    Field(discriminator="state"),
]


class TrainStatus(Shape):
    executor: Literal["train"]
    details: Status


class ActionRequest(Shape):
    job_id: StrictStr
    status: TrainStatus


ACTION_REQUEST: TypeAdapter[ActionRequest] = TypeAdapter(ActionRequest)


def action_request(job_id: str, status: Status) -> dict[str, Any]:
    """The body of `POST /action/update` reporting `status`."""
    return wire(ActionRequest(job_id=job_id, status=TrainStatus(executor="train", details=status)))


JOINED = UnitStatus(state="joined")
IDLE = UnitStatus(state="idle")
APPLIED_UPDATE = UnitStatus(state="applied-update")
SENT_MODEL = UnitStatus(state="sent-model")
RECEIVED_MODEL = UnitStatus(state="received-model")
WAITED_FOR_MODEL = UnitStatus(state="waited-for-model")
PUSHED_TO_HUB = UnitStatus(state="pushed-to-hub")


def batch_completed(batch_size: int, batches: int) -> BatchCompletedStatus:
    # `batches` always beside `batch_size`: the newest types require it, older ones ignore it.
    return BatchCompletedStatus(state="batch-completed", batch_size=batch_size, batches=batches)


def sent_update(round_number: int, metrics: dict[str, float]) -> SentUpdateStatus:
    # The scheduler's metrics are f32, and JSON has no NaN: only finite values go.
    finite = {name: value for name, value in metrics.items() if math.isfinite(value)}
    return SentUpdateStatus(state="sent-update", round=round_number, metrics=finite)


def error_status(kind: Literal["connection", "other"], message: str) -> ErrorStatus:
    """`connection` for the bridge and the network, `other` for the rest."""
    return ErrorStatus(state="error", type=kind, message=" ".join(message.split())[:500])


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
    # Why, where it is not the job's end: the scheduler's own failure.
    reason: str = ""


# What upstream's scheduler answers, whatever the executor, when handling a request fails
# inside it (rl_scheduler.rs, index id 66469012466): the job is over, by no fault of ours.
SCHEDULER_FAILED = (
    "the scheduler ended the job: it failed handling our request and answered a gymnasium "
    "`terminate`, its answer to an error of its own"
)


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
        return SystemTime(secs_since_epoch=secs, nanos_since_epoch=nanos).seconds

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
    body = next_.get("action")
    gymnasium = next_.get("executor") == "gymnasium"
    if gymnasium and isinstance(body, dict) and body.get("kind") == "terminate":
        return Terminate(SCHEDULER_FAILED)
    if next_.get("executor") != "train":
        raise SchedulerError(
            f"the scheduler sent an action for a {next_.get('executor')!r} executor"
        )
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


def action_response(job_id: str, action: Action) -> dict[str, Any]:
    """The ActionResponse a scheduler sends with `action`: what parse_action_response reads
    (the stand-in's scheduler answers through it)."""
    return {"job_id": job_id, "next": {"executor": "train", "action": _action_body(action)}}


def _action_body(action: Action) -> dict[str, Any]:
    def deadline(seconds: float) -> dict[str, Any]:
        return wire(SystemTime.at(seconds))

    match action:
        case Idle(deadline=at):
            return {"kind": "idle", "timeout": deadline(at)}
        case WaitForModel(deadline=at):
            return {"kind": "wait-for-model", "timeout": deadline(at)}
        case ReceiveModel(source=source, deadline=at):
            return {"kind": "receive-model", "source": wire(source), "timeout": deadline(at)}
        case SendModel(target=target):
            return {"kind": "send-model", "target": wire(target)}
        case ExecuteBatch(batches=batches, lr_multiplier=None):
            return {"kind": "execute-batch", "batches": batches}
        case ExecuteBatch(batches=batches, lr_multiplier=multiplier):
            return {"kind": "execute-batch", "batches": batches, "lr_multiplier": multiplier}
        case SendUpdate(target=target, weight=weight):
            return {"kind": "send-update", "target": wire(target), "weight": weight}
        case ApplyUpdate(source=source, deadline=at):
            return {"kind": "apply-update", "source": wire(source), "timeout": deadline(at)}
        case PushToHub(repository=repository, token=token):
            return {"kind": "push-to-hub", "repository": repository, "token": token}
        case Terminate():
            return {"kind": "terminate"}
    raise AssertionError(f"not an action: {action!r}")
