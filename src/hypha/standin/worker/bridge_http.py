"""The bridge's HTTP face: routes, answers and the SSE stream over the Unix socket.

Thin: the request body is read the way axum reads it (axum_body.py), and every route's
meaning is JobBridge's (bridge_core.py).
"""

from __future__ import annotations

import json
import queue
import socketserver
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from hypha.accelerate_executor.protocol.actions.messages import (
    ACTION_RECEIVE_REQUEST,
    ACTION_REQUEST,
    ACTION_SEND_REQUEST,
)
from hypha.accelerate_executor.protocol.alpha17.messages import (
    BODY_REFERENCE,
    PROGRESS,
    RECEIVE_REQUEST,
    SEND_REQUEST,
)
from hypha.accelerate_executor.protocol.messages import wire
from hypha.standin.console import say
from hypha.standin.errors import BridgeRefusal
from hypha.standin.serving import LISTEN_BACKLOG, TracksConnections
from hypha.standin.worker.axum_body import deserialized, read_json, shaped
from hypha.standin.worker.bridge_core import JobBridge
from hypha.standin.worker.faults import Fault, kill_sender
from hypha.standin.worker.openapi import openapi_document


class UnixHTTPServer(TracksConnections, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False
    # Statuses sent concurrently connect at once; a full Unix-socket backlog refuses EAGAIN.
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, path: str, bridge: JobBridge) -> None:
        super().__init__(path, _Handler, bind_and_activate=False)
        self.bridge = bridge
        self.log_name = bridge.name


_ALPHA17_ROUTES = ("/resources/fetch", "/resources/send", "/resources/receive", "/status/send")
_ACTION_ROUTES = ("/resources/fetch", "/resources/send", "/resources/receive", "/action/update")


class _Handler(BaseHTTPRequestHandler):
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

    @property
    def routes(self) -> tuple[str, ...]:
        return _ACTION_ROUTES if self.bridge.generation == "actions" else _ALPHA17_ROUTES

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/openapi.json":
            self._reply(200, json.dumps(openapi_document()).encode(), "application/json")
        elif path in self.routes:
            self._reply(405, b"", None, allow="POST")
        else:
            self._reply(404, b"", None)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path not in self.routes:
            if path == "/openapi.json":
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
                reference = deserialized(BODY_REFERENCE, raw)
                if fault is not None:
                    say(self.bridge.name, f"fault on demand: {path} hands out truncated files")
                fetched = self.bridge.fetch(reference, truncated=fault is not None)
                self._reply(200, json.dumps(fetched).encode(), "application/json")
            elif path == "/resources/send" and self.bridge.generation == "actions":
                self.bridge.send_now(deserialized(ACTION_SEND_REQUEST, raw))
                self._reply(200, b"", None)
            elif path == "/resources/send":
                self.bridge.send(deserialized(SEND_REQUEST, raw))
                self._reply(200, b"", None)
            elif path == "/resources/receive" and self.bridge.generation == "actions":
                request = deserialized(ACTION_RECEIVE_REQUEST, raw)
                if fault is not None:
                    say(self.bridge.name, f"fault on demand: {path} writes slowly")
                received = self.bridge.receive_one(request, fault.seconds if fault else 0.0)
                if received is None:
                    self._reply(204, b"", None)
                else:
                    self._reply(200, json.dumps(received).encode(), "application/json")
            elif path == "/resources/receive":
                events = self.bridge.open_stream(deserialized(RECEIVE_REQUEST, raw))
                if fault is not None:
                    say(self.bridge.name, f"fault on demand: {path} ends after one event")
                self._stream(events, cut=fault is not None)
            elif path == "/action/update":
                answer = self.bridge.action(wire(shaped(ACTION_REQUEST, raw)))
                self._reply(200, json.dumps(answer).encode(), "application/json")
            else:
                answer = self.bridge.status(shaped(PROGRESS, raw))
                self._reply(200, json.dumps(answer).encode(), "application/json")
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

    def _stream(self, events: queue.Queue[dict[str, Any] | None] | None, cut: bool = False) -> None:
        """Serves the SSE stream (chunked, as the worker's HTTP stack does) until it ends;
        `cut`: ends it after its first event (a fault on demand)."""
        self.close_connection = True
        self.send_response(200, "OK")
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()  # the client waits for the head before any event comes
        try:
            while events is not None:
                try:
                    event = events.get(timeout=self.bridge.keepalive_s)
                except queue.Empty:
                    chunk = b": keepalive\n\n"
                else:
                    if event is None:
                        break
                    chunk = b"data: " + json.dumps(event).encode() + b"\n\n"
                self.wfile.write(b"%X\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                if cut and chunk.startswith(b"data:"):
                    break
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the client went away: the stream is over, later pushes go unannounced
        finally:
            if events is not None:
                self.bridge.close_stream()
