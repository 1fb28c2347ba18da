"""A two-worker, two-round job of the local stand-in with the OTEL_* variables a later Hypha
worker passes, exporting to a real OTLP endpoint on loopback (the stand-in's receiver, which
decodes each body with the OpenTelemetry protobuf definitions, over OTLP/HTTP or OTLP/gRPC),
and what must have arrived there."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.standin.coordinator.server import RunOptions
from hypha.standin.demo import run_demo
from hypha.standin.otlp_receiver import Receiver
from hypha.standin.worker.executor_entries import ExecutorEntry

HEADER_SECRET = "otlp-token-5d1e0c2b9a"
SERVICE = "hypha-worker-under-test"
# A round's line as the worker echoes it: `[w1] round 1: loss 6.2508 | ...`.
ROUND_LINE = re.compile(r"^\[(w\d)\] (round (\d): loss (\d+\.\d{4}) \|.*)$", re.MULTILINE)
HTTP_PATHS = ("/v1/logs", "/v1/metrics")
# The collector services' methods, as the receiver records a gRPC request's path.
GRPC_PATHS = (
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
)


@contextmanager
def otlp_endpoint(grpc: bool = False, grpc_credentials: Any = None) -> Iterator[Receiver]:
    """The receiver on loopback, serving OTLP/HTTP, and OTLP/gRPC too when `grpc`."""
    grpc_address = ("127.0.0.1", 0) if grpc else None
    receiver = Receiver(
        ("127.0.0.1", 0), grpc_address=grpc_address, grpc_credentials=grpc_credentials
    )
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()


def telemetry_variables(endpoint: str, protocol: str = "http/protobuf") -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {HEADER_SECRET}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }


def run_two_workers(
    executor: ExecutorEntry,
    work_base: Path,
    out: Path,
    owner: tuple[int, int] | None = None,
    generation: Generation = "alpha17",
) -> dict[str, Any]:
    """The job's summary, once both workers' executors finished their two rounds."""
    run_demo(
        RunOptions.for_job(
            "causal-lm", workers=2, rounds=2, steps_per_round=3, generation=generation
        ),
        executor,
        out_dir=out,
        work_base=work_base,
        owner=owner,
        timeout_s=600,
    )  # its verdict wants a loss that falls further than two rounds take it
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert [w["exit_code"] for w in summary["workers"].values()] == [0, 0], summary["workers"]
    return summary


def rounds_printed(output: str, generation: Generation) -> list[tuple[str, str, int, str]]:
    """(worker, line, round, loss as printed) for every round line with a loss that the
    workers echoed: both rounds of each under alpha.17; under the action protocol, where a
    worker that joins late sends its first update with nothing trained, at least one each."""
    found = [(w, line, int(n), loss) for w, line, n, loss in ROUND_LINE.findall(output)]
    rounds = sorted((w, n) for w, _, n, _ in found)
    if generation == "alpha17":
        assert rounds == [("w1", 1), ("w1", 2), ("w2", 1), ("w2", 2)], output
    else:
        assert {w for w, _ in rounds} == {"w1", "w2"}, output
    return found


def check_arrived(
    receiver: Receiver,
    output: str,
    generation: Generation = "alpha17",
    paths: tuple[str, ...] = HTTP_PATHS,
) -> None:
    """Every round's line as a log record, and its loss as a metric point, each with the
    worker's resource attributes and service name, the job id and the rank; and the header
    on every request (`paths`: OTLP/HTTP's, or gRPC's methods), added on the host."""
    logs = [item for item in receiver.items if item.signal == "log"]
    losses = [i for i in receiver.items if i.name == "hypha.training.loss"]
    for worker, line, number, loss in rounds_printed(output, generation):
        records = [r for r in logs if r.value == line]
        assert len(records) == 1, (line, [r.value for r in logs])
        record = records[0]
        assert record.name == "INFO"
        assert record.attributes["round"] == number
        assert f"{record.attributes['loss']:.4f}" == loss
        resource = record.resource
        assert resource["service.name"] == SERVICE
        assert resource["deployment.environment"] == "test"
        assert resource["hypha.worker.name"] == worker
        assert resource["hypha.rank"] == 0
        job_id = resource["hypha.job.id"]
        points = [p for p in losses if p.resource["hypha.job.id"] == job_id]
        assert loss in {f"{p.value:.4f}" for p in points}, (worker, number, loss, points)
        assert all(p.resource["hypha.worker.name"] == worker for p in points)
    metric_names = {item.name for item in receiver.items if item.signal == "metric"}
    assert {
        "process.cpu.time",
        "process.memory.usage",
        "hypha.training.samples_per_second",
        "hypha.training.peak_host_memory_bytes_rank_0",  # every rank's peaks, from rank 0
        "hypha.training.peak_host_memory_bytes",
    } <= metric_names
    assert receiver.requests
    for path, headers in receiver.requests:
        assert path in paths
        assert headers.get("authorization") == f"Bearer {HEADER_SECRET}"
