"""alpha.17's bridge routes over HTTP (docs/protocol.md section 2): the shared handler
(worker/bridge_http.py) with alpha.17's send, SSE receive stream, status and OpenAPI
document; and the bridge served on its socket."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.protocol.alpha17.messages import (
    BODY_REFERENCE,
    PROGRESS,
    RECEIVE_REQUEST,
    SEND_REQUEST,
)
from hypha.standin.alpha17.bridge import Alpha17Bridge
from hypha.standin.alpha17.openapi import openapi_document
from hypha.standin.backend import BridgeBackend
from hypha.standin.console import say
from hypha.standin.worker.axum_body import deserialized, shaped
from hypha.standin.worker.bridge_http import BridgeHandler
from hypha.standin.worker.bridge_server import BridgeServer, WorkerSettings
from hypha.standin.worker.faults import Fault


class Alpha17Handler(BridgeHandler):
    routes = ("/resources/fetch", "/resources/send", "/resources/receive", "/status/send")
    fetch_reference = BODY_REFERENCE

    @property
    def alpha17(self) -> Alpha17Bridge:
        bridge = self.bridge
        assert isinstance(bridge, Alpha17Bridge)
        return bridge

    def openapi(self) -> dict[str, Any] | None:
        return openapi_document()

    def _route(self, path: str, raw: Any, fault: Fault | None) -> None:
        if path == "/resources/send":
            self.alpha17.send(deserialized(SEND_REQUEST, raw))
            self._reply(200, b"", None)
        elif path == "/resources/receive":
            events = self.alpha17.open_stream(deserialized(RECEIVE_REQUEST, raw))
            if fault is not None:
                say(self.bridge.name, f"fault on demand: {path} ends after one event")
            self._stream(events, cut=fault is not None)
        else:
            answer = self.alpha17.status(shaped(PROGRESS, raw))
            self._reply(200, json.dumps(answer).encode(), "application/json")

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
                self.alpha17.close_stream()


class Alpha17BridgeServer(BridgeServer, Alpha17Bridge):
    """alpha.17's bridge served on WORK_DIR/bridge.sock from `start()` until `stop()`."""

    handler = Alpha17Handler
    reports_job_status = False  # alpha.17's worker prints the executor's stderr

    @classmethod
    def for_worker(
        cls, work_dir: Path, backend: BridgeBackend, settings: WorkerSettings
    ) -> Alpha17BridgeServer:
        """Its routes name no job, and its one receive stream has no receives to be strict
        about: the job id and `strict_receive` are the action protocol's."""
        return cls(
            work_dir,
            backend,
            owner=settings.owner,
            keepalive_s=settings.keepalive_s,
            name=settings.name,
        )
