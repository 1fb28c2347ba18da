"""What the executor posts to the Job Bridge, declared once as the Hypha worker's serde reads
it: the executor builds its requests from these models, and the local stand-in's bridge
(standin/worker) reads requests through them, refusing what serde refuses.

The send and receive bodies of both generations are models whose serde reading is derived
(spec.serde.struct), as the job's are; alpha.17's Progress (`/status/send`) is read by
pydantic, strictly, as serde reads an externally tagged enum. The action protocol's
statuses and actions are in actions.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
)

from hypha.accelerate_executor.spec.job import (
    ACTION_REFERENCE,
    REFERENCE,
    ActionReference,
    Reference,
)
from hypha.accelerate_executor.spec.serde import Default, Integer, Str, Tagged, struct


class Shape(BaseModel):
    # serde ignores unknown fields unless told otherwise.
    model_config = ConfigDict(frozen=True, extra="ignore")


U32 = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
# The scheduler's metrics: f32 by name; JSON has no NaN.
Metrics = dict[StrictStr, StrictFloat | StrictInt]


def wire(body: BaseModel) -> dict[str, Any]:
    """A body as JSON values, by the names the bridge reads. Python's floats stay floats: a
    NaN is refused where the JSON is written, never turned into null."""
    return body.model_dump(by_alias=True)


# `/resources/send` and `/resources/receive`. The reference is read straight from the body,
# not buffered by an enclosing tagged enum: string tags only. Any reference is read, so that
# a request of the right shape with a reference the route refuses gets the route's 400.
BODY_REFERENCE = Tagged(REFERENCE.tag, REFERENCE.variants, index_tags=False)
ACTION_BODY_REFERENCE = Tagged(ACTION_REFERENCE.tag, ACTION_REFERENCE.variants, index_tags=False)
DEFAULT_RECEIVE_DIR = "incoming"


class SendRequest(Shape):
    resource: Annotated[Reference, BODY_REFERENCE]
    path: str


class ReceiveRequest(Shape):
    resource: Annotated[Reference, BODY_REFERENCE]
    path: Annotated[str, Default(Str())] = DEFAULT_RECEIVE_DIR


# The action-era bridge (bridge.rs @3058282936): send is synchronous and requires
# `remove_file`; receive waits for one file until `timeout`, an absolute SystemTime.


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


SEND_REQUEST = struct(SendRequest)
RECEIVE_REQUEST = struct(ReceiveRequest)
ACTION_SEND_REQUEST = struct(ActionSendRequest)
ACTION_RECEIVE_REQUEST = struct(ActionReceiveRequest)


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
