"""OpenTelemetry out of the executor: its log lines, each round's metrics, and process and
GPU metrics, over OTLP/HTTP, labelled with the job id and rank (docs/telemetry.md).

On when HYPHA_OTLP_SOCKET names the shim's relay socket (the container has no network: the
relay on the host forwards, and adds the headers that carry tokens), or when
OTEL_EXPORTER_OTLP_ENDPOINT (or a signal's own endpoint) is set for an executor that runs on
the host: the SDK then reads the endpoint and headers itself. Off otherwise, and off with
OTEL_SDK_DISABLED=true: every function here is then a test of one global and nothing else.

Nothing of it runs on a training step's path: log records are queued and exported in
batches by the SDK's thread, metrics are collected by the reader's thread, and each round's
end only wakes a thread that flushes them. Torch-free, and the SDK is imported only when on.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry._logs import Logger
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider

SOCKET_VARIABLE = "HYPHA_OTLP_SOCKET"
ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
SCOPE = "hypha.accelerate_executor"
JOB_ID_ATTRIBUTE = "hypha.job.id"
RANK_ATTRIBUTE = "hypha.rank"
# What a flush at exit may take: the worker SIGKILLs 5 s after SIGTERM.
FLUSH_AT_EXIT_S = 2.0
SEVERITIES = ("INFO", "WARN", "ERROR")


def wanted(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(env.get(SOCKET_VARIABLE)) or any(env.get(name) for name in ENDPOINT_VARIABLES)


def _unit(name: str) -> str:
    """The UCUM unit a round metric's name implies."""
    if name.endswith("_per_second"):
        return "1/s"
    if name.endswith("_seconds"):
        return "s"
    if name.endswith("_bytes"):
        return "By"
    return "1"


class Telemetry:
    """One process's exporters: its logger, its meter, and the thread that flushes the
    metrics at each round's end. `env` gives the route (the relay's socket, else the SDK's
    own endpoint) and LOCAL_RANK; the SDK reads its OTEL_* from the process's environment."""

    def __init__(self, job_id: str, rank: int, env: Mapping[str, str]) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        from hypha.accelerate_executor.telemetry.system_metrics import observe_process_and_gpus

        # The worker's OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, read by the SDK, plus ours.
        resource = Resource.create({JOB_ID_ATTRIBUTE: job_id, RANK_ATTRIBUTE: rank})
        socket_path = env.get(SOCKET_VARIABLE)
        if socket_path:  # OTLP/HTTP to the relay, whatever protocol the relay speaks on
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            from hypha.accelerate_executor.telemetry.otlp_unix import RELAY_URL, unix_session

            log_exporter = OTLPLogExporter(
                endpoint=f"{RELAY_URL}/v1/logs", session=unix_session(socket_path)
            )
            metric_exporter = OTLPMetricExporter(
                endpoint=f"{RELAY_URL}/v1/metrics", session=unix_session(socket_path)
            )
        else:
            log_exporter, metric_exporter = _native_exporters(env)
        self.logs: LoggerProvider = LoggerProvider(resource=resource)
        self.logs.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
        self.meters: MeterProvider = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter)]
        )
        self.logger: Logger = self.logs.get_logger(SCOPE)
        self.meter: Meter = self.meters.get_meter(SCOPE)
        self._gauges: dict[str, Any] = {}
        observe_process_and_gpus(self.meter, gpus=env.get("LOCAL_RANK", "0") == "0")
        self._round_ended = threading.Event()
        threading.Thread(target=self._flush_rounds, name="telemetry-rounds", daemon=True).start()

    def line(self, text: str, severity: str, attributes: Mapping[str, Any] | None) -> None:
        from opentelemetry._logs import SeverityNumber

        self.logger.emit(
            body=text,
            severity_text=severity,
            severity_number=SeverityNumber[severity],
            attributes=dict(attributes or {}),
        )

    def round_ended(self, metrics: Mapping[str, float]) -> None:
        """Each metric as a gauge named hypha.training.NAME, then a flush off this thread, so
        that every round's values leave, however short the round."""
        for name, value in metrics.items():
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = self._gauges[name] = self.meter.create_gauge(
                    f"hypha.training.{name}", unit=_unit(name)
                )
            gauge.set(value)
        self._round_ended.set()

    def _flush_rounds(self) -> None:
        while True:
            self._round_ended.wait()
            self._round_ended.clear()
            self.meters.force_flush()

    def flush(self, within_s: float) -> None:
        """What is queued, out within `within_s` however slow the endpoint is: the logs and
        the metrics flushed side by side, in threads that the exit does not wait for."""
        deadline = time.monotonic() + within_s
        threads = [
            threading.Thread(target=provider.force_flush, daemon=True)
            for provider in (self.logs, self.meters)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class GrpcExporterMissing(ImportError):
    """The worker asked for OTLP/gRPC, and this environment has no gRPC exporter."""


def _grpc(env: Mapping[str, str], signal: str) -> bool:
    """Whether the OTLP spec's protocol variables (the signal's own, else the common one)
    ask `signal` to go over gRPC."""
    protocol = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    return (protocol or "").strip() == "grpc"


def _native_exporters(env: Mapping[str, str]) -> tuple[Any, Any]:
    """An executor on the host exports itself: the SDK's OTLP/HTTP exporters, or its OTLP/gRPC
    ones for a signal whose protocol is grpc. Those need opentelemetry-exporter-otlp-proto-grpc
    (and grpcio), which no image carries: in a container, the shim's relay speaks gRPC."""
    if _grpc(env, "logs") or _grpc(env, "metrics"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc import _log_exporter as grpc_logs
            from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc_metrics
        except ImportError:
            raise GrpcExporterMissing(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "in the executor's environment (under the shim, gRPC is relayed without it)"
            ) from None
    from opentelemetry.exporter.otlp.proto.http import _log_exporter as http_logs
    from opentelemetry.exporter.otlp.proto.http import metric_exporter as http_metrics

    logs = grpc_logs if _grpc(env, "logs") else http_logs
    metrics = grpc_metrics if _grpc(env, "metrics") else http_metrics
    return logs.OTLPLogExporter(), metrics.OTLPMetricExporter()


_active: Telemetry | None = None


def start(job_id: str, env: Mapping[str, str] = os.environ) -> None:
    """Sets up this process's telemetry when the environment asks for it."""
    global _active
    if _active is None and wanted(env):
        try:
            _active = Telemetry(job_id, int(env.get("RANK", "0")), env)
        except GrpcExporterMissing as exc:
            print(f"warning: telemetry off: {exc}", flush=True)
        except ImportError as exc:  # a native install without the [telemetry] extra
            print(f"warning: telemetry off: {exc} (the [telemetry] extra)", flush=True)


def log_line(
    text: str, severity: str | None = None, attributes: Mapping[str, Any] | None = None
) -> None:
    """A line the executor printed, as a log record: `severity` one of SEVERITIES, by
    default WARN for a `warning:` line and INFO for any other."""
    if _active is not None:
        if severity is None:
            severity = "WARN" if text.lstrip().lower().startswith("warning") else "INFO"
        _active.line(text, severity, attributes)


def round_ended(metrics: Mapping[str, float]) -> None:
    if _active is not None:
        _active.round_ended(metrics)


def flush_at_exit() -> None:
    if _active is not None:
        _active.flush(FLUSH_AT_EXIT_S)
