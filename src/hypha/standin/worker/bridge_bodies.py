"""The bridge's request bodies as the Hypha worker deserializes them (serde shapes).

The references are the job's (job.REFERENCE) as serde reads them: no more, so that a
request of the right shape with a value the worker refuses (an ftp URL, an empty filename
list) reaches the route and gets the route's 400, not a 422.
"""

from __future__ import annotations

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

from hypha.accelerate_executor.spec.job import ACTION_REFERENCE, REFERENCE, Reference
from hypha.accelerate_executor.spec.serde import Bool, Default, Integer, Str, Struct, Tagged

# Read straight from the body, not buffered by an enclosing tagged enum: string tags only.
BODY_REFERENCE = Tagged(REFERENCE.tag, REFERENCE.variants, index_tags=False)
SEND_REQUEST = Struct({"resource": BODY_REFERENCE, "path": Str()})
RECEIVE_REQUEST = Struct({"resource": BODY_REFERENCE, "path": Default(Str())})

U32 = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]

# The action-era bridge (bridge.rs @3058282936): send is synchronous and requires
# `remove_file`; receive waits for one file until `timeout`, an absolute SystemTime.
ACTION_BODY_REFERENCE = Tagged(ACTION_REFERENCE.tag, ACTION_REFERENCE.variants, index_tags=False)
SYSTEM_TIME = Struct({"secs_since_epoch": Integer("u64"), "nanos_since_epoch": Integer("u32")})
ACTION_SEND_REQUEST = Struct(
    {"resource": ACTION_BODY_REFERENCE, "path": Str(), "remove_file": Bool()}
)
ACTION_RECEIVE_REQUEST = Struct(
    {"resource": ACTION_BODY_REFERENCE, "path": Default(Str()), "timeout": Default(SYSTEM_TIME)}
)


class Shape(BaseModel):
    # serde ignores unknown fields unless told otherwise.
    model_config = ConfigDict(frozen=True, extra="ignore")


# Progress is an externally tagged enum: a bare string for unit variants, an object with
# exactly one key otherwise.


class StatusBody(Shape):
    batch_size: U32


class MetricsBody(Shape):
    round: U32
    metrics: dict[StrictStr, StrictFloat | StrictInt]


class StatusProgress(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    status: StatusBody


class MetricsProgress(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    metrics: MetricsBody


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
    Annotated[Literal["update", "update-received", "updated"], Tag("unit")]
    | Annotated[StatusProgress, Tag("status")]
    | Annotated[MetricsProgress, Tag("metrics")],
    Discriminator(
        _progress_variant,
        custom_error_type="invalid_progress",
        custom_error_message='expected a progress message: "update", "update-received", '
        '"updated", {"status": {...}} or {"metrics": {...}}',
    ),
]
PROGRESS: TypeAdapter[Any] = TypeAdapter(Progress)


SCHEDULER_ANSWER_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"type": {"enum": ["Ok", "Continue", "Done", "Error"]}},
            "required": ["type"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "ScheduleUpdate"},
                "counter": {"type": "integer", "minimum": 0},
            },
            "required": ["type", "counter"],
        },
    ]
}


def openapi_document() -> dict[str, Any]:
    """The bridge's OpenAPI document, its schemas generated from the shapes above and the
    job's references."""
    components: dict[str, Any] = {}

    def schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
        generated = adapter.json_schema(ref_template="#/components/schemas/{model}")
        components.update(generated.pop("$defs", {}))
        return generated

    reference = schema(TypeAdapter(Reference))

    def request(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"resource": reference, **properties},
            "required": required,
        }

    def route(summary: str, body: dict[str, Any] | None, answer: dict[str, Any]) -> dict[str, Any]:
        operation: dict[str, Any] = {
            "summary": summary,
            "responses": {
                **answer,
                "400": {"description": "invalid_request (JSON) or malformed JSON (plain text)"},
                "413": {"description": "body over 2 MiB (plain text)"},
                "415": {"description": "content type is not JSON (plain text)"},
                "422": {"description": "body of the wrong shape (plain text)"},
                "500": {"description": "io_error, network_error or connector_error (JSON)"},
            },
        }
        if body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body}},
            }
        return operation

    artifacts = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "size": {"type": "integer"}},
        },
    }
    paths = {
        "/resources/fetch": {
            "post": route(
                "Fetch a uri, huggingface or scheduler reference into artifacts/",
                reference,
                {
                    "200": {
                        "description": "the files, once on disk",
                        "content": {"application/json": {"schema": artifacts}},
                    }
                },
            )
        },
        "/resources/send": {
            "post": route(
                "Send a file to peers; answers before the copy is done",
                request({"path": {"type": "string"}}, ["resource", "path"]),
                {"200": {"description": "accepted, empty body"}},
            )
        },
        "/resources/receive": {
            "post": route(
                "Stream the files peers push, as server-sent events",
                request({"path": {"type": "string", "default": "incoming"}}, ["resource"]),
                {
                    "200": {
                        "description": "data: {path, size, from_peer} events",
                        "content": {"text/event-stream": {}},
                    }
                },
            )
        },
        "/status/send": {
            "post": route(
                "Report progress; answers with the scheduler's response",
                schema(PROGRESS),
                {
                    "200": {
                        "description": "scheduler answer",
                        "content": {"application/json": {"schema": SCHEDULER_ANSWER_SCHEMA}},
                    }
                },
            )
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Hypha Job Bridge (local stand-in)", "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }


# The action protocol's ActionRequest for a train executor (crates/messages @3058282936):
# `{"job_id", "status": {"executor": "train", "details": {"state": ..., fields}}}`.


class UnitState(Shape):
    state: Literal[
        "joined", "idle", "applied-update", "pushed-to-hub", "sent-model", "received-model",
        "waited-for-model", "terminated",
    ]  # fmt: skip


class BatchCompletedState(Shape):
    state: Literal["batch-completed"]
    batch_size: U32
    batches: U32


class SentUpdateState(Shape):
    state: Literal["sent-update"]
    round: U32
    metrics: dict[StrictStr, StrictFloat | StrictInt]


class ErrorState(Shape):
    state: Literal["error"]
    type: Literal["connection", "other"]
    message: StrictStr


class TrainStatusBody(Shape):
    executor: Literal["train"]
    details: Annotated[
        UnitState | BatchCompletedState | SentUpdateState | ErrorState,
        Field(discriminator="state"),
    ]


class ActionRequestBody(Shape):
    job_id: StrictStr
    status: TrainStatusBody


ACTION_REQUEST: TypeAdapter[ActionRequestBody] = TypeAdapter(ActionRequestBody)
