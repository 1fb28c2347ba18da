"""A tiny OTLP endpoint for the stand-in: what an operator's collector would be, for the
compose cluster's telemetry profile and the tests (docs/telemetry.md).

    python -m hypha.standin.otlp_receiver [--listen HOST:PORT] [--grpc-listen HOST:PORT]
        [--out FILE]

Serves OTLP/HTTP, and with --grpc-listen OTLP/gRPC as well (the collector services of
opentelemetry-proto's generated *_pb2_grpc modules, with grpcio). Decodes each request with
the OpenTelemetry protobuf definitions and keeps every log record and metric data point with
its resource's attributes; prints one line for each and, with --out, appends it to FILE as
JSON.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_OK, UsageError

PROG = "otlp-receiver"


@dataclass(frozen=True)
class Item:
    """One log record or one metric data point."""

    signal: str  # "log" or "metric"
    resource: dict[str, Any]
    name: str  # a metric's name; a log record's severity
    value: Any  # a metric point's value; a log record's body
    attributes: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        who = " ".join(
            f"{key} {self.resource[key]}"
            for key in ("service.name", "hypha.worker.name", "hypha.job.id", "hypha.rank")
            if key in self.resource
        )
        return f"{self.signal} {self.name} {self.value} [{who}]"


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(signal: str, body: bytes) -> list[Item]:
    """The items of one OTLP/HTTP protobuf request body for `signal` (logs, metrics, traces:
    spans are not kept)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    if signal == "logs":
        return items_of(signal, ExportLogsServiceRequest.FromString(body))
    if signal == "metrics":
        return items_of(signal, ExportMetricsServiceRequest.FromString(body))
    return []


def items_of(signal: str, request: Any) -> list[Item]:
    """The items of one decoded Export<Signal>ServiceRequest."""
    items: list[Item] = []
    if signal == "logs":
        logs = request
        for resource_logs in logs.resource_logs:
            resource = _attributes(resource_logs.resource.attributes)
            for scope in resource_logs.scope_logs:
                items += [
                    Item(
                        "log", resource, r.severity_text, _value(r.body), _attributes(r.attributes)
                    )
                    for r in scope.log_records
                ]
    elif signal == "metrics":
        metrics = request
        for resource_metrics in metrics.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    if kind not in ("gauge", "sum"):
                        continue
                    for point in getattr(metric, kind).data_points:
                        value = getattr(point, point.WhichOneof("value"))
                        items.append(
                            Item(
                                "metric",
                                resource,
                                metric.name,
                                value,
                                _attributes(point.attributes),
                            )
                        )
    return items


class Receiver(http.server.ThreadingHTTPServer):
    """Serves OTLP/HTTP until `shutdown()`, and OTLP/gRPC on `grpc_address` when given (from
    construction until `server_close()`); `items` and `requests` (each request's path, or
    gRPC method, and headers, or metadata) grow as requests come in. `grpc_credentials`
    (grpc.ServerCredentials): gRPC over TLS."""

    daemon_threads = True
    # A class default: server_close() runs inside super().__init__ when the bind fails.
    _grpc: Any = None

    def __init__(
        self,
        address: tuple[str, int],
        out: Path | None = None,
        echo: bool = False,
        grpc_address: tuple[str, int] | None = None,
        grpc_credentials: Any = None,
    ):
        super().__init__(address, _Handler)
        self.items: list[Item] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.out, self.echo = out, echo
        self.grpc_port = 0
        self._grpc_tls = grpc_credentials is not None
        if grpc_address is not None:
            try:
                self._grpc, self.grpc_port = _serve_grpc(self, grpc_address, grpc_credentials)
            except BaseException:
                super().server_close()
                raise

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def grpc_url(self) -> str:
        """The OTLP/gRPC endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT names it."""
        scheme = "https" if self._grpc_tls else "http"
        return f"{scheme}://{self.server_address[0]!s}:{self.grpc_port}"

    def server_close(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None)
            self._grpc = None
        super().server_close()

    def take(self, path: str, headers: dict[str, str], items: list[Item]) -> None:
        with self.lock:
            self.requests.append((path, headers))
            self.items += items
            if self.out is not None:
                with self.out.open("a") as out:
                    out.writelines(json.dumps(asdict(item)) + "\n" for item in items)
            if self.echo:
                for item in items:
                    print(item.line(), flush=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        signal = self.path.rstrip("/").rpartition("/")[2]
        try:
            items = decode(signal, body)
        except Exception as exc:  # a body that is not the signal's protobuf
            self.send_error(400, f"cannot decode {signal}: {type(exc).__name__}")
            return
        self.server.take(self.path, {k.lower(): v for k, v in self.headers.items()}, items)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the items are the output."""


def _serve_grpc(receiver: Receiver, address: tuple[str, int], credentials: Any) -> tuple[Any, int]:
    """A gRPC server with the OTLP logs and metrics services, started, and its port."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import (
        metrics_service_pb2,
        metrics_service_pb2_grpc,
    )

    def take(signal: str, method: str, request: Any, context: Any) -> None:
        metadata = {key: value for key, value in context.invocation_metadata()}
        receiver.take(method, metadata, items_of(signal, request))

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            take("logs", "/opentelemetry.proto.collector.logs.v1.LogsService/Export", request, context)  # fmt: skip
            return logs_service_pb2.ExportLogsServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            take("metrics", "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", request, context)  # fmt: skip
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    target = f"{address[0]}:{address[1]}"
    try:
        port = (
            server.add_secure_port(target, credentials)
            if credentials is not None
            else server.add_insecure_port(target)
        )
    except RuntimeError:  # grpcio's way of saying the bind failed
        server.stop(grace=None)
        raise OSError(f"cannot listen on {target} for OTLP/gRPC") from None
    server.start()
    return server, port


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = OneLineArgumentParser(prog=PROG, description="A tiny OTLP endpoint.")
        p.add_argument("--listen", type=_address, default=("127.0.0.1", 4318))
        p.add_argument(
            "--grpc-listen", type=_address, help="serve OTLP/gRPC too, on HOST:PORT (4317 usual)"
        )
        p.add_argument("--out", type=Path, help="append every item to FILE as JSON lines")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        try:
            receiver = Receiver(args.listen, args.out, echo=True, grpc_address=args.grpc_listen)
        except OSError as exc:  # the HTTP side's bind (strerror), or the gRPC side's
            where = f"cannot listen on {args.listen}: {exc.strerror}"
            raise UsageError(where if exc.strerror else str(exc)) from None
        except ImportError as exc:
            raise UsageError(f"--grpc-listen needs grpcio: {exc}") from None
        print(f"{PROG}: OTLP/HTTP on {receiver.url}", flush=True)
        if args.grpc_listen:
            print(f"{PROG}: OTLP/gRPC on {receiver.grpc_url}", flush=True)
        receiver.serve_forever()
        return EXIT_OK

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
