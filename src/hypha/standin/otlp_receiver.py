"""A tiny OTLP/HTTP endpoint for the stand-in: what an operator's collector would be, for
the compose cluster's telemetry profile and the tests (docs/telemetry.md).

    python -m hypha.standin.otlp_receiver [--listen HOST:PORT] [--out FILE]

Decodes each request with the OpenTelemetry protobuf definitions (opentelemetry-proto) and
keeps every log record and metric data point with its resource's attributes; prints one line
for each and, with --out, appends it to FILE as JSON.
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

    items: list[Item] = []
    if signal == "logs":
        logs = ExportLogsServiceRequest.FromString(body)
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
        metrics = ExportMetricsServiceRequest.FromString(body)
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
    """Serves until `shutdown()`; `items` and `requests` (each request's path and headers)
    grow as requests come in."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], out: Path | None = None, echo: bool = False):
        super().__init__(address, _Handler)
        self.items: list[Item] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.out, self.echo = out, echo

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

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


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = OneLineArgumentParser(prog=PROG, description="A tiny OTLP/HTTP endpoint.")
        p.add_argument("--listen", type=_address, default=("127.0.0.1", 4318))
        p.add_argument("--out", type=Path, help="append every item to FILE as JSON lines")
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
        try:
            receiver = Receiver(args.listen, args.out, echo=True)
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
        print(f"{PROG}: OTLP/HTTP on {receiver.url}", flush=True)
        receiver.serve_forever()
        return EXIT_OK

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
