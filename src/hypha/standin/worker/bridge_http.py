"""The bridge's HTTP face: what both generations' routes share over the Unix socket.

Thin: the request body is read the way axum reads it (axum_body.py), and every route's
meaning is the bridge's (bridge_core.py and a generation's bridge). A generation's handler
(alpha17/bridge_http.py, actions/bridge_http.py) names its routes and answers those beyond
the shared fetch.
"""

from __future__ import annotations

import json
import socketserver
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar
from urllib.parse import urlsplit

from hypha.accelerate_executor.protocol.serde import SerdeType
from hypha.standin.console import say
from hypha.standin.errors import BridgeRefusal
from hypha.standin.serving import LISTEN_BACKLOG, TracksConnections
from hypha.standin.worker.axum_body import deserialized, read_json
from hypha.standin.worker.bridge_core import JobBridge
from hypha.standin.worker.faults import Fault, kill_sender


class UnixHTTPServer(TracksConnections, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False
    # Statuses sent concurrently connect at once; a full Unix-socket backlog refuses EAGAIN.
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, path: str, bridge: JobBridge, handler: type[BridgeHandler]) -> None:
        super().__init__(path, handler, bind_and_activate=False)
        self.bridge = bridge
        self.log_name = bridge.name


class BridgeHandler(BaseHTTPRequestHandler):
    """One connection's requests to a bridge. A generation's subclass sets `routes` and
    answers its own (`_route`)."""

    # The POST routes the generation serves; /resources/fetch is answered here, its body
    # read as the generation's Reference.
    routes: ClassVar[tuple[str, ...]]
    fetch_reference: ClassVar[SerdeType]

    protocol_version = "HTTP/1.1"
    # Buffered, so that an answer's head and body leave in one write: a client woken by the
    # head alone would only go back to sleep until the body comes.
    wbufsize = -1
    server: UnixHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        # The default logs the client address, which a Unix socket does not have.
        pass

    def handle_expect_100(self) -> bool:
        accepted = super().handle_expect_100()
        self.wfile.flush()  # the client holds the body back until the 100 comes
        return accepted

    @property
    def bridge(self) -> JobBridge:
        return self.server.bridge

    def openapi(self) -> dict[str, Any] | None:
        """The bridge's OpenAPI document, served on GET /openapi.json; None: not served."""
        return None

    def _route(self, path: str, raw: Any, fault: Fault | None) -> None:
        """Answers a POST to one of the generation's routes beyond the fetch: `raw`, the
        request's JSON; `fault`, a fault on demand the route plays itself (faults.py)."""
        raise NotImplementedError

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        document = self.openapi() if path == "/openapi.json" else None
        if document is not None:
            self._reply(200, json.dumps(document).encode(), "application/json")
        elif path in self.routes:
            self._reply(405, b"", None, allow="POST")
        else:
            self._reply(404, b"", None)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path not in self.routes:
            if path == "/openapi.json" and self.openapi() is not None:
                self._reply(405, b"", None, allow="GET")
            else:
                self._reply(404, b"", None)
            return
        try:
            raw = read_json(self)
            data_slice = (
                path == "/resources/fetch"
                and isinstance(raw, dict)
                and raw.get("type") == "scheduler"
            )
            fault = self.bridge.faults.take(path, data_slice)
            if fault is not None and not fault.served:
                self._answer_fault(path, fault, raw)
                return
            if path == "/resources/fetch":
                reference = deserialized(self.fetch_reference, raw)
                if fault is not None:
                    say(self.bridge.name, f"fault on demand: {path} hands out truncated files")
                fetched = self.bridge.fetch(reference, truncated=fault is not None)
                self._reply(200, json.dumps(fetched).encode(), "application/json")
            else:
                self._route(path, raw, fault)
        except BridgeRefusal as exc:
            self._reply(exc.status, exc.body, exc.content_type)

    def _answer_fault(self, path: str, fault: Fault, request: object) -> None:
        """A fault on demand (faults.py): its error answered, or the executor killed."""
        if fault.kills:
            pid = kill_sender(self.connection)
            say(self.bridge.name, f"fault on demand: {path} killed the executor (pid {pid})")
            self.close_connection = True
            return
        say(self.bridge.name, f"fault on demand: {path} answered {fault.status} {fault.error}")
        job_id = request.get("job_id") if isinstance(request, dict) else None
        body = fault.body_for(job_id)
        self._reply(fault.status, body, "application/json" if body else None)

    def do_PUT(self) -> None:
        self._reply(405 if self.path in self.routes else 404, b"", None)

    do_DELETE = do_PATCH = do_PUT

    # Responses.

    def _reply(self, status: int, body: bytes, content_type: str | None, **headers: str) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.title(), value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
