"""Protocol emulation: a request body read and refused as the Hypha worker's HTTP stack
(axum's `Json` extractor) does it, in its order and with its plain-text bodies:

    415  the content type is not JSON        "Expected request with `Content-Type: application/json`"
    413  the body is over 2 MiB               "Failed to buffer the request body: length limit exceeded"
    400  the body is not JSON (NaN included)  "Failed to parse the request body as JSON: ..."
    422  the JSON has the wrong shape         "Failed to deserialize the JSON body into the target type: ..."
"""

from __future__ import annotations

import json
from contextlib import suppress
from http.server import BaseHTTPRequestHandler
from typing import Any

from pydantic import TypeAdapter, ValidationError

from hypha.accelerate_executor.errors import SerdeError
from hypha.accelerate_executor.protocol.serde import SerdeType
from hypha.accelerate_executor.protocol.serde_json import from_python
from hypha.standin.errors import BridgeRefusal

MAX_BODY_BYTES = 2 * 1024 * 1024
# A refused body up to this size is read and dropped; a larger one costs the connection.
DRAIN_LIMIT_BYTES = 64 * 1024 * 1024


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def read_json(handler: BaseHTTPRequestHandler) -> Any:
    """The request's body as JSON: 415, 413 or 400 (a BridgeRefusal) when axum would refuse it."""
    content_type = handler.headers.get("Content-Type", "").split(";")[0].strip().lower()
    is_json = content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )
    if not is_json:
        # Drained first, so the client sees the answer, not a broken pipe.
        with suppress(BridgeRefusal):
            _read_body(handler)
        raise BridgeRefusal(415, "Expected request with `Content-Type: application/json`")
    body = _read_body(handler)
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BridgeRefusal(400, f"Failed to parse the request body as JSON: {exc}") from None


def _unprocessable(detail: str) -> BridgeRefusal:
    return BridgeRefusal(422, f"Failed to deserialize the JSON body into the target type: {detail}")


def shaped(adapter: TypeAdapter[Any], raw: Any) -> Any:
    """`raw` validated into the route's pydantic shape (protocol/), or the 422 serde's error
    gives."""
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"]) or "body"
        raise _unprocessable(f"{where}: {error['msg']}") from None


def deserialized(kind: SerdeType, raw: Any) -> Any:
    """`raw` read as the route's serde type (protocol/) in its canonical shape, or the 422."""
    try:
        return kind.decode(from_python(raw), ())
    except SerdeError as exc:
        raise _unprocessable(str(exc)) from None


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    too_large = BridgeRefusal(413, "Failed to buffer the request body: length limit exceeded")
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        return _read_chunked(handler, too_large)
    length_header = handler.headers.get("Content-Length")
    if length_header is None:
        return b""
    try:
        length = int(length_header)
        if length < 0:
            raise ValueError(length_header)
    except ValueError:
        handler.close_connection = True
        raise BridgeRefusal(400, "invalid Content-Length header") from None
    if length > MAX_BODY_BYTES:
        _discard(handler, length)
        raise too_large
    return handler.rfile.read(length)


def _discard(handler: BaseHTTPRequestHandler, length: int) -> None:
    """Reads and drops a body refused for its size (see read_json for why)."""
    if length > DRAIN_LIMIT_BYTES:
        handler.close_connection = True
        return
    while length > 0:
        chunk = handler.rfile.read(min(length, 1 << 16))
        if not chunk:
            break
        length -= len(chunk)


def _read_chunked(handler: BaseHTTPRequestHandler, too_large: BridgeRefusal) -> bytes:
    rfile = handler.rfile
    body = bytearray()
    total = 0
    while True:
        line = rfile.readline(1024)
        try:
            size = int(line.split(b";")[0].strip(), 16)
        except ValueError:
            handler.close_connection = True
            raise BridgeRefusal(400, "malformed chunked body") from None
        if size == 0:
            while rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            if total > MAX_BODY_BYTES:
                raise too_large
            return bytes(body)
        total += size
        if total > DRAIN_LIMIT_BYTES:
            handler.close_connection = True
            raise too_large
        chunk = rfile.read(size)
        # Past the limit the rest is only drained, so the client sees the 413.
        if total <= MAX_BODY_BYTES:
            body += chunk
        rfile.readline(1024)
