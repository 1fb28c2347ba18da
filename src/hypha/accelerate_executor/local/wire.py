"""The bridge's request bodies as the Hypha worker deserializes them (serde shapes).

These are deliberately looser than the executor's job models: they check only what
serde checks (types, tags, integers that are integers), so that a request of the right
shape but with a value the worker refuses (an ftp URL, an empty filename list) reaches
the route and gets the route's 400, not a 422.
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

U32 = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
U64 = Annotated[StrictInt, Field(ge=0, le=2**64 - 1)]


class Shape(BaseModel):
    # serde ignores unknown fields unless told otherwise.
    model_config = ConfigDict(frozen=True, extra="ignore")


class Strategy(Shape):
    type: Literal["All", "One", "Random"]


class DatasetSlice(Shape):
    dataset: StrictStr
    index: U64


class UriReference(Shape):
    type: Literal["uri"]
    value: StrictStr


class HuggingFaceReference(Shape):
    type: Literal["huggingface"]
    repository: StrictStr
    revision: StrictStr | None = None
    filenames: list[StrictStr]
    token: StrictStr | None = Field(default=None, repr=False)


class PeersReference(Shape):
    type: Literal["peers"]
    peers: list[StrictStr]
    strategy: Strategy
    resource: DatasetSlice | None = None


class SchedulerReference(Shape):
    type: Literal["scheduler"]
    peer: StrictStr
    dataset: StrictStr


Reference = Annotated[
    UriReference | HuggingFaceReference | PeersReference | SchedulerReference,
    Field(discriminator="type"),
]


class SendRequest(Shape):
    resource: Reference
    path: StrictStr


class ReceiveRequest(Shape):
    resource: Reference
    path: StrictStr = "incoming"


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


REFERENCE: TypeAdapter[Any] = TypeAdapter(Reference)

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
    """The bridge's OpenAPI document, its schemas generated from the shapes above."""
    components: dict[str, Any] = {}

    def schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
        generated = adapter.json_schema(ref_template="#/components/schemas/{model}")
        components.update(generated.pop("$defs", {}))
        return generated

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
                schema(REFERENCE),
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
                schema(TypeAdapter(SendRequest)),
                {"200": {"description": "accepted, empty body"}},
            )
        },
        "/resources/receive": {
            "post": route(
                "Stream the files peers push, as server-sent events",
                schema(TypeAdapter(ReceiveRequest)),
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
