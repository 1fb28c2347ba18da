"""alpha.17's messages (docs/protocol.md): the send and receive bodies, the progress messages a
train executor posts to `/status/send`, and the scheduler's answers to them, declared once.

The send and receive bodies are models whose serde reading is derived (protocol.serde.struct),
as the job's are; Progress is read by pydantic, strictly, as serde reads an externally tagged
enum. The executor writes progress and reads answers through what is here; the stand-in reads
progress (its bridge refusing what serde refuses) and writes answers through the same
declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter

from hypha.accelerate_executor.errors import BridgeAnswerError, SchedulerError
from hypha.accelerate_executor.protocol.alpha17.job import REFERENCE, Reference
from hypha.accelerate_executor.protocol.messages import (
    DEFAULT_RECEIVE_DIR,
    U32,
    Metrics,
    Shape,
)
from hypha.accelerate_executor.protocol.serde import Default, Str, Tagged, struct

STATUS_ROUTE = "/status/send"

# `/resources/send` and `/resources/receive`. The reference is read straight from the body,
# not buffered by an enclosing tagged enum: string tags only. Any reference is read, so that
# a request of the right shape with a reference the route refuses gets the route's 400.
BODY_REFERENCE = Tagged(REFERENCE.tag, REFERENCE.variants, index_tags=False)


class SendRequest(Shape):
    resource: Annotated[Reference, BODY_REFERENCE]
    path: str


class ReceiveRequest(Shape):
    resource: Annotated[Reference, BODY_REFERENCE]
    path: Annotated[str, Default(Str())] = DEFAULT_RECEIVE_DIR


SEND_REQUEST = struct(SendRequest)
RECEIVE_REQUEST = struct(ReceiveRequest)


# alpha.17's Progress (`/status/send`), an externally tagged enum: a bare string for unit
# variants, an object with exactly one key otherwise.

UnitProgress = Literal["update", "update-received", "updated"]


class StatusBody(Shape):
    batch_size: U32


class MetricsBody(Shape):
    round: U32
    metrics: Metrics


class StatusProgress(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    status: StatusBody


class MetricsProgress(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    metrics: MetricsBody


def batch_status(batch_size: int) -> StatusProgress:
    return StatusProgress(status=StatusBody(batch_size=batch_size))


def round_metrics(round_number: int, metrics: dict[str, float]) -> MetricsProgress:
    return MetricsProgress(metrics=MetricsBody(round=round_number, metrics=metrics))


def _progress_variant(raw: Any) -> str | None:
    # Picks the variant up front, so a shape error names the field, not every variant.
    if isinstance(raw, str):
        return "unit"
    if isinstance(raw, StatusProgress | MetricsProgress):  # when dumping
        return "status" if isinstance(raw, StatusProgress) else "metrics"
    if isinstance(raw, dict) and len(raw) == 1:
        key = next(iter(raw))
        return key if key in ("status", "metrics") else None
    return None


Progress = Annotated[
    Annotated[UnitProgress, Tag("unit")]
    | Annotated[StatusProgress, Tag("status")]
    | Annotated[MetricsProgress, Tag("metrics")],
    Discriminator(
        _progress_variant,
        custom_error_type="invalid_progress",
        custom_error_message='expected a progress message: "update", "update-received", '
        '"updated", {"status": {...}} or {"metrics": {...}}',
    ),
]
PROGRESS: TypeAdapter[Progress] = TypeAdapter(Progress)


# The scheduler's answers to progress.


@dataclass(frozen=True)
class Ok:
    """To `update` and `metrics`."""


@dataclass(frozen=True)
class Continue:
    """To `status`: train on; to `update-received`: the next round."""


@dataclass(frozen=True)
class ScheduleUpdate:
    """To `status`: train `counter` more batches after those counted, then synchronise."""

    counter: int


@dataclass(frozen=True)
class Done:
    """The job is over."""


@dataclass(frozen=True)
class Error:
    """The scheduler refused the message (a `status` while an update is in flight)."""


SchedulerAnswer = Ok | Continue | ScheduleUpdate | Done | Error
# On the wire, `{"type": <the class's name>}`, and ScheduleUpdate's `counter` beside it.
_ANSWERS: dict[str, SchedulerAnswer] = {
    type(answer).__name__: answer for answer in (Ok(), Continue(), Done(), Error())
}
ANSWER_NAMES = tuple(_ANSWERS)  # the answers without fields


def parse_answer(value: Any) -> SchedulerAnswer:
    """The scheduler's answer (`{"type": ...}`, docs/protocol.md section 5) as a typed value."""
    if not isinstance(value, dict):
        raise BridgeAnswerError(
            STATUS_ROUTE, 200, "bad_answer", f"not a scheduler answer: {value!r}"
        )
    kind = value.get("type")
    if kind == ScheduleUpdate.__name__:
        counter = value.get("counter")
        if type(counter) is not int or counter < 0:  # a u32 in Hypha's scheduler
            raise SchedulerError(f"the scheduler's ScheduleUpdate has no valid counter: {value!r}")
        return ScheduleUpdate(counter)
    answer = _ANSWERS.get(kind) if isinstance(kind, str) else None
    if answer is None:
        raise SchedulerError(f"the scheduler answered something unknown: {value!r}")
    return answer


def answer_body(answer: SchedulerAnswer) -> dict[str, Any]:
    """The answer as the scheduler sends it, what parse_answer reads: the stand-in's
    scheduler answers through it."""
    fields = {"counter": answer.counter} if isinstance(answer, ScheduleUpdate) else {}
    return {"type": type(answer).__name__, **fields}


def expect(answer: SchedulerAnswer, *allowed: type[SchedulerAnswer], sent: str) -> None:
    """SchedulerError unless `answer` is of one of the `allowed` kinds."""
    if not isinstance(answer, allowed):
        raise SchedulerError(
            f"the scheduler answered {type(answer).__name__!r} to {sent!r}; expected "
            f"{' or '.join(kind.__name__ for kind in allowed)}"
        )
