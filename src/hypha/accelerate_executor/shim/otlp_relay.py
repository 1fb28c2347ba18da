"""The executor's telemetry out of a container that has no network (docs/telemetry.md).

When the worker configured OTLP (OTEL_EXPORTER_OTLP_ENDPOINT, or a signal's own endpoint),
the shim serves OTLP/HTTP on WORK_DIR/otlp.sock for the job's life, and forwards each
request as it came, body untouched, to the real endpoint, adding the headers of
OTEL_EXPORTER_OTLP_HEADERS (tokens, usually) here on the host: they never enter the
container, its environment or `docker inspect`. The container gets the socket's path and
the worker's resource attributes and service name (container_env).

The executor always sends OTLP/HTTP with protobuf bodies. Where the worker asked for
OTLP/gRPC (OTEL_EXPORTER_OTLP_PROTOCOL=grpc, or a signal's own _PROTOCOL), the relay sends
the same protobuf bytes as a gRPC unary call to the collector's Export method, the headers as
gRPC metadata (otlp_grpc.py). With http/json the job runs without telemetry, and the shim
says so in one line.
"""

from __future__ import annotations

import gzip
import http.server
import os
import socketserver
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hypha.accelerate_executor.shim.otlp_upstream import TelemetryConfigError, Upstream
from hypha.accelerate_executor.shim.owner_socket import OwnerOnlySocket
from hypha.accelerate_executor.telemetry import SOCKET_VARIABLE

if TYPE_CHECKING:
    from hypha.accelerate_executor.shim.otlp_grpc import GrpcForwarder

SOCKET_NAME = "otlp.sock"
# What the executor in the container may read: nothing in it is secret.
PASSED_ON = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_BLRP_SCHEDULE_DELAY",
)
FORWARDED_REQUEST_HEADERS = ("Content-Type", "Content-Encoding")
FORWARD_TIMEOUT_S = 10.0


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    upstream: Upstream
    grpc: GrpcForwarder | None

    def handle_error(self, request: object, client_address: object) -> None:
        """Silent: the one error left, an executor gone before its answer (it stops waiting
        for its last flush at exit, after the request was forwarded), is nobody's to fix,
        and the shim's output is the executor's log."""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        upstream = self.server.upstream
        signal = self.path.rstrip("/").rpartition("/v1/")[2]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.grpc is not None and signal in upstream.grpc:
            if self.headers.get("Content-Encoding") == "gzip":  # the call carries it plain
                body = gzip.decompress(body)
            self._answer(*self.server.grpc.export(signal, body))
            return
        if signal not in upstream.urls:
            self._answer(404, b"", "text/plain")
            return
        request = urllib.request.Request(upstream.urls[signal], data=body, method="POST")
        for name in FORWARDED_REQUEST_HEADERS:
            if name in self.headers:
                request.add_header(name, self.headers[name])
        for name, value in upstream.headers[signal].items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(
                request, timeout=FORWARD_TIMEOUT_S, context=upstream.tls
            ) as response:
                self._answer(response.status, response.read(), response.headers["Content-Type"])
        except urllib.error.HTTPError as exc:
            self._answer(exc.code, exc.read(), exc.headers["Content-Type"])
        except (OSError, ValueError):
            # Unreachable: the exporter retries or drops the batch, training goes on.
            self._answer(502, b"", "text/plain")

    def _answer(self, status: int, body: bytes, content_type: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Nothing on the shim's output: that is the executor's log."""


class OtlpRelay(OwnerOnlySocket):
    """Serves the relay on WORK_DIR/otlp.sock from `start()` until `stop()`, connectable by
    `owner` (the container's uid:gid) only. Raises TelemetryConfigError when a signal goes
    over gRPC and grpcio is not installed."""

    _server: _Server

    def __init__(self, work_dir: str, upstream: Upstream, owner: tuple[int, int]) -> None:
        socket_path = os.path.join(work_dir, SOCKET_NAME)
        server = _Server(socket_path, _Handler, bind_and_activate=False)
        server.upstream = upstream
        server.grpc = None
        if upstream.grpc:  # grpcio is imported only here: the shim starts fast without it
            # gRPC's core logs a failed TLS handshake or connection on stderr, which is the
            # executor's log here; the exporter hears of it as the HTTP status it acts on.
            # Read at grpcio's first import; an operator's own setting stays.
            os.environ.setdefault("GRPC_VERBOSITY", "NONE")
            try:
                from hypha.accelerate_executor.shim.otlp_grpc import GrpcForwarder
            except ImportError:
                server.server_close()
                raise TelemetryConfigError(
                    "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs grpcio on the host (the [shim] extra)"
                ) from None
            server.grpc = GrpcForwarder(upstream, FORWARD_TIMEOUT_S)
        super().__init__(socket_path, server, owner, "otlp-relay")

    def stop(self) -> None:
        super().stop()
        if self._server.grpc is not None:
            self._server.grpc.close()

    def container_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The executor's telemetry settings: the socket, and what the worker set that is
        no secret."""
        passed = {name: env[name] for name in PASSED_ON if env.get(name)}
        return {SOCKET_VARIABLE: self.socket_path, **passed}
