"""The coordinator's HTTP face: a small HTTP/1.1 API on TCP (connections kept alive) that
the workers' bridges call (client.py). Thin: every route is a Coordinator call.

    GET  /health                              {"ok": true}
    POST /jobs               {"worker": NAME}  the job spec for that worker
    GET  /jobs/ID                             {"state": "running"|"cancelled", "reason": ...}
    POST /jobs/ID/fetch      <reference>       {"files": [{"name", "blob"}]}
    GET  /blobs/BLOB                          the file's bytes
    POST /jobs/ID/status     <progress>        the scheduler's answer
    POST /jobs/ID/action     <ActionRequest>   the scheduler's ActionResponse (action protocol)
    POST /jobs/ID/push?peer=P <bytes>          {} (a file for peer P: the parameter server)
    GET  /jobs/ID/pushes?after=N&wait=S       200 the next file pushed to the job
                                              (X-Seq, X-From-Peer, X-Retry-S), or 204
    POST /jobs/ID/pushes/N/verdict?taken=0|1  {} (the job's bridge took or refused push N)
    POST /jobs/ID/exit {"exit_code", "leaks", "status"?}  {}
    GET  /summary                             the run so far (Coordinator.summary)

Errors are {"error": "connector_error"|"network_error"|"invalid_request", "detail": ...}.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.errors import CoordinatorRefusal
from hypha.standin.serving import LISTEN_BACKLOG, AcceptLoop, TracksConnections


class CoordinatorServer(TracksConnections, ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG  # every worker's bridge forwards statuses at once

    def __init__(self, address: tuple[str, int], coordinator: CoordinatorCore) -> None:
        super().__init__(address, _Handler)
        self.coordinator = coordinator
        self.log_name = coordinator.name
        self._accepting = AcceptLoop(self, f"{coordinator.name}-http")

    def start(self) -> None:
        self._accepting.start()

    def stop(self) -> None:
        self._accepting.stop()
        self.cut_connections()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    # Kept-alive connections: the bridges report every training step through here.
    protocol_version = "HTTP/1.1"
    # Head and body of an answer leave in one write: with Nagle's algorithm a second small
    # write on a kept-alive connection waits for the client's delayed ACK.
    wbufsize = -1
    disable_nagle_algorithm = True
    server: CoordinatorServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def coordinator(self) -> CoordinatorCore:
        return self.server.coordinator

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        coordinator = self.coordinator
        try:
            # Read whatever the route, so that no body is left on a kept-alive connection.
            body = self._body()
            match method, parts:
                case "GET", ["health"]:
                    self._json({"ok": True})
                case "GET", ["summary"]:
                    self._json(coordinator.summary())
                case "POST", ["jobs"]:
                    self._json(coordinator.assign_job(str(_object(body).get("worker", ""))))
                case "GET", ["jobs", job_id]:
                    self._json(coordinator.job_state(job_id))
                case "POST", ["jobs", job_id, "fetch"]:
                    self._json({"files": coordinator.fetch(job_id, _object(body))})
                case "GET", ["blobs", blob]:
                    self._file(coordinator.blob_path(blob))
                case "POST", ["jobs", job_id, "status"]:
                    self._json(coordinator.status(job_id, _object(body)))
                case "POST", ["jobs", job_id, "action"]:
                    self._json(coordinator.action(job_id, _object(body)))
                case "POST", ["jobs", job_id, "push"]:
                    coordinator.push(job_id, query.get("peer", ""), body)
                    self._json({})
                case "GET", ["jobs", job_id, "pushes"]:
                    push = coordinator.next_push(
                        job_id, int(query.get("after", "0")), float(query.get("wait", "0"))
                    )
                    if push is None:
                        self._reply(204, b"", {})
                    else:
                        self._reply(
                            200,
                            push.data,
                            {
                                "X-Seq": str(push.seq),
                                "X-From-Peer": push.from_peer,
                                "X-Retry-S": str(push.retry_s),
                            },
                        )
                case "POST", ["jobs", job_id, "pushes", seq, "verdict"]:
                    coordinator.settle_push(job_id, int(seq), query.get("taken") == "1")
                    self._json({})
                case "POST", ["jobs", job_id, "exit"]:
                    request = _object(body)
                    coordinator.report_exit(
                        job_id,
                        int(request["exit_code"]),
                        [str(leak) for leak in request.get("leaks", [])],
                        _status(request.get("status")),
                    )
                    self._json({})
                case _:
                    raise CoordinatorRefusal(
                        404, "invalid_request", f"no route {method} {url.path}"
                    )
        except CoordinatorRefusal as exc:
            self._json({"error": exc.kind, "detail": exc.detail}, exc.status)
        except (ValueError, KeyError, TypeError) as exc:
            self._json({"error": "invalid_request", "detail": f"malformed request: {exc}"}, 400)

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            # Where this body ends is unknown, so nothing after it on the connection can be read.
            self.close_connection = True
            raise
        return self.rfile.read(length)

    def _json(self, payload: Any, status: int = 200) -> None:
        self._reply(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def _file(self, path: Path) -> None:
        try:
            source = path.open("rb")
            size = os.fstat(source.fileno()).st_size
        except OSError as exc:
            raise CoordinatorRefusal(
                500, "connector_error", f"cannot read {path.name}: {exc.strerror}"
            ) from None
        with source:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            sent = 0
            with suppress(OSError):
                while chunk := source.read(1 << 20):
                    self.wfile.write(chunk)
                    sent += len(chunk)
            if sent != size:
                # The answer's head is out: all that is left is to cut the body short, which
                # the client sees as a broken download.
                self.close_connection = True

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _object(body: bytes) -> Any:
    """A request body that must be a JSON object (or, for progress, a string)."""
    value = json.loads(body or b"{}")
    if not isinstance(value, dict | str):
        raise ValueError("expected a JSON object")
    return value


def _status(value: Any) -> dict[str, str | None] | None:
    """A reported job status: its state and texts, each a string or null."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("expected the job status as a JSON object")
    fields = ("state", "description", "out", "err")
    return {name: None if value.get(name) is None else str(value[name]) for name in fields}
