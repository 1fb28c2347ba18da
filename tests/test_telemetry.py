"""Telemetry (docs/telemetry.md): the shim's relay on a real Unix socket forwarding to a real
OTLP/HTTP endpoint on loopback, and the executor as a host process exporting its log lines
and round metrics there. The container path: tests/shim/test_shim_telemetry.py."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.shim.otlp_relay import (
    OtlpRelay,
    TelemetryConfigError,
    upstream_from,
)
from hypha.accelerate_executor.spec.job import GENERATIONS, Generation
from hypha.accelerate_executor.telemetry import SOCKET_VARIABLE, Telemetry, wanted
from hypha.standin.otlp_receiver import Receiver
from telemetry_job import (
    HEADER_SECRET,
    check_arrived,
    otlp_endpoint,
    rounds_printed,
    run_two_workers,
    telemetry_variables,
)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def relay(receiver: Receiver, short_tmp: Path) -> Iterator[OtlpRelay]:
    upstream = upstream_from(telemetry_variables(receiver.url))
    assert upstream is not None
    relay = OtlpRelay(str(short_tmp), upstream, (os.getuid(), os.getgid()))
    relay.start()
    yield relay
    relay.stop()
    assert not Path(relay.socket_path).exists()


def test_the_relay_forwards_the_executors_export_and_adds_the_headers_on_the_host(
    receiver: Receiver, relay: OtlpRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = relay.container_env(telemetry_variables(receiver.url))
    # What the container gets: the socket and the resource, no endpoint and no secret.
    assert env[SOCKET_VARIABLE] == relay.socket_path
    assert env["OTEL_SERVICE_NAME"] == telemetry_variables("")["OTEL_SERVICE_NAME"]
    assert not any(name.startswith("OTEL_EXPORTER") for name in env)
    assert HEADER_SECRET not in repr(env) and HEADER_SECRET not in repr(upstream_from(
        telemetry_variables(receiver.url)))  # fmt: skip
    assert oct(os.stat(relay.socket_path).st_mode & 0o777) == "0o600"
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.setenv(name, env[name])
    exporting = Telemetry("job-7", 3, env)
    exporting.line("warning: a line", "WARN", None)
    exporting.round_ended({"loss": 2.5, "sent_bytes": 1e6})
    exporting.flush(10.0)
    exporting.meters.shutdown()
    exporting.logs.shutdown()
    log = next(item for item in receiver.items if item.signal == "log")
    assert (log.name, log.value) == ("WARN", "warning: a line")
    assert log.resource["hypha.job.id"] == "job-7" and log.resource["hypha.rank"] == 3
    assert log.resource["deployment.environment"] == "test"
    metrics = {i.name: i.value for i in receiver.items if i.signal == "metric"}
    assert metrics["hypha.training.loss"] == 2.5
    assert metrics["hypha.training.sent_bytes"] == 1e6
    assert metrics["process.memory.usage"] > 0
    assert {h["authorization"] for _, h in receiver.requests} == {f"Bearer {HEADER_SECRET}"}


def test_an_unreachable_endpoint_answers_502_and_training_is_not_held(short_tmp: Path) -> None:
    import requests

    from hypha.accelerate_executor.telemetry.otlp_unix import RELAY_URL, unix_session

    upstream = upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert upstream is not None
    relay = OtlpRelay(str(short_tmp), upstream, (os.getuid(), os.getgid()))
    relay.start()
    try:
        answer = unix_session(relay.socket_path).post(f"{RELAY_URL}/v1/logs", data=b"", timeout=30)
        assert answer.status_code == 502
        with pytest.raises(requests.ConnectionError):
            unix_session(str(short_tmp / "none.sock")).post(f"{RELAY_URL}/v1/logs", data=b"")
    finally:
        relay.stop()


def test_an_executor_gone_before_its_answer_leaves_no_trace_on_the_shims_output(
    receiver: Receiver, relay: OtlpRelay, capfd: pytest.CaptureFixture[str]
) -> None:
    """It stopped waiting for its last flush at exit: the request still reaches the
    endpoint, and the relay says nothing."""
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(relay.socket_path)
        client.sendall(b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    deadline = time.monotonic() + 10
    while not receiver.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the answer written into the closed connection
    assert [path for path, _ in receiver.requests] == ["/v1/logs"]
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    ("env", "off"),
    [
        ({}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, True),  # compose's empty default
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:4318/v1/logs"}, False),
    ],
)
def test_telemetry_is_on_only_when_an_endpoint_is_configured(
    env: dict[str, str], off: bool
) -> None:
    assert wanted(env) is not off
    assert (upstream_from(env) is None) is off


def test_signal_endpoints_and_headers_follow_the_exporters_rules() -> None:
    upstream = upstream_from({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318/",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://m:9/custom",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=two%20words",
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "b=3",
    })  # fmt: skip
    assert upstream is not None
    assert upstream.urls == {
        "logs": "https://c:4318/v1/logs",
        "metrics": "https://m:9/custom",
        "traces": "https://c:4318/v1/traces",
    }
    assert upstream.headers["logs"] == {"a": "1", "b": "3"}
    assert upstream.headers["metrics"] == {"a": "1", "b": "two words"}


def test_a_protocol_other_than_http_protobuf_is_refused() -> None:
    with pytest.raises(TelemetryConfigError, match="grpc"):
        upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_two_worker_job_on_the_host_exports_every_round(
    generation: Generation,
    receiver: Receiver,
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from hypha.standin.worker.executor_entries import preset

    for name, value in telemetry_variables(receiver.url).items():
        monkeypatch.setenv(name, value)
    run_two_workers(preset("process"), short_tmp, short_tmp / "out", generation=generation)
    check_arrived(receiver, capfd.readouterr().out, generation)


@pytest.mark.slow
def test_without_the_variables_nothing_is_exported(
    receiver: Receiver, short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from hypha.standin.worker.executor_entries import preset

    assert not wanted(os.environ)
    run_two_workers(preset("process"), short_tmp, short_tmp / "out")
    rounds_printed(capfd.readouterr().out, "alpha17")
    assert receiver.requests == []


@pytest.mark.slow
def test_the_one_line_failure_arrives_as_an_error_record(
    receiver: Receiver, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.worker.executor_entries import preset
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    class MissingModel(Coordinator):
        def job_spec(self, job_id: str) -> dict[str, Any]:
            spec = super().job_spec(job_id)
            spec["executor"]["config"]["model"]["artifact"]["filenames"] = ["absent.bin"]
            return spec

    for name, value in telemetry_variables(receiver.url).items():
        monkeypatch.setenv(name, value)
    coordinator = MissingModel(
        Catalog.from_assets(ensure_assets()), RunOptions(workers=1, rounds=1, steps_per_round=2)
    )
    coordinator.start()
    try:
        code = serve_one_job(
            CoordinatorClient(coordinator.url), LocalWorker("w1", preset("process"), short_tmp)
        )
    finally:
        coordinator.stop()
    assert code == 1
    errors = [i for i in receiver.items if i.signal == "log" and i.name == "ERROR"]
    assert len(errors) == 1, [(i.name, i.value) for i in receiver.items if i.signal == "log"]
    assert errors[0].value.startswith("hypha.accelerate_executor.training: ")
    assert errors[0].resource["hypha.worker.name"] == "w1"
