"""The alpha.17 bridge's OpenAPI document, its schemas generated from the executor's
declarations of the request bodies (protocol/) and the job's references: the shapes
the client writes and the stand-in reads, spelled once."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from hypha.accelerate_executor.protocol.alpha17.job import Reference
from hypha.accelerate_executor.protocol.alpha17.messages import (
    ANSWER_NAMES,
    PROGRESS,
    ReceiveRequest,
    SendRequest,
)

SCHEDULER_ANSWER_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"type": {"enum": list(ANSWER_NAMES)}},
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
    """The bridge's OpenAPI document."""
    components: dict[str, Any] = {}

    def schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
        generated = adapter.json_schema(ref_template="#/components/schemas/{model}")
        components.update(generated.pop("$defs", {}))
        return generated

    reference = schema(TypeAdapter(Reference))

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
