"""Telemetry (docs/telemetry.md): the shim's relay on a real Unix socket forwarding to a real
OTLP endpoint on loopback, over OTLP/HTTP or OTLP/gRPC (plaintext and TLS), and the executor
as a host process exporting its log lines and round metrics there. The container path:
tests/shim/test_shim_telemetry.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.protocol.generation import GENERATIONS, Generation
from hypha.accelerate_executor.shim.otlp_relay import OtlpRelay
from hypha.accelerate_executor.shim.otlp_upstream import (
    GrpcRoute,
    TelemetryConfigError,
    grpc_route,
    upstream_from,
)
from hypha.accelerate_executor.telemetry import SOCKET_VARIABLE, Telemetry, wanted
from hypha.standin.otlp_receiver import Receiver
from telemetry_job import (
    GRPC_PATHS,
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


def test_a_protocol_other_than_http_protobuf_or_grpc_is_refused() -> None:
    with pytest.raises(TelemetryConfigError, match=r"^OTEL_EXPORTER_OTLP_LOGS_PROTOCOL=http/json is not relayed"):  # fmt: skip
        upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/json"})  # fmt: skip
    # Traces' own protocol refuses nothing: the executor makes no spans.
    upstream = upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})  # fmt: skip
    assert upstream is not None and set(upstream.urls) == {"logs", "metrics"}


# OTLP/gRPC: the executor still posts OTLP/HTTP protobuf to the relay; the relay calls the
# collector's Export method with the same bytes, the headers as metadata.


def export_a_round(env: dict[str, str]) -> None:
    """What an executor exports in a round, `env` routing it: a line and the round's figures."""
    exporting = Telemetry("job-7", 0, env)
    exporting.line("round 1: loss 2.5000", "INFO", None)
    exporting.round_ended({"loss": 2.5})
    exporting.flush(10.0)
    exporting.meters.shutdown()
    exporting.logs.shutdown()


def arrived(receiver: Receiver) -> tuple[list[str], set[float]]:
    """The log bodies, and the values of the loss points (each flush exports the gauge
    again), that reached `receiver`."""
    lines = [item.value for item in receiver.items if item.signal == "log"]
    losses = {item.value for item in receiver.items if item.name == "hypha.training.loss"}
    return lines, losses


@pytest.fixture
def grpc_receiver() -> Iterator[Receiver]:
    with otlp_endpoint(grpc=True) as endpoint:
        yield endpoint


def relay_for(variables: dict[str, str], work_dir: Path) -> OtlpRelay:
    upstream = upstream_from(variables)
    assert upstream is not None
    relay = OtlpRelay(str(work_dir), upstream, (os.getuid(), os.getgid()))
    relay.start()
    return relay


def test_the_relay_calls_a_grpc_collector_with_the_headers_as_metadata(
    grpc_receiver: Receiver, short_tmp: Path
) -> None:
    variables = telemetry_variables(grpc_receiver.grpc_url, "grpc")
    relay = relay_for(variables, short_tmp)
    try:
        env = relay.container_env(variables)
        assert not any(name.startswith("OTEL_EXPORTER") for name in env)
        export_a_round(env)
    finally:
        relay.stop()
    assert arrived(grpc_receiver) == (["round 1: loss 2.5000"], {2.5})
    assert {path for path, _ in grpc_receiver.requests} == set(GRPC_PATHS)
    assert {h["authorization"] for _, h in grpc_receiver.requests} == {f"Bearer {HEADER_SECRET}"}


def test_each_signal_takes_its_own_protocol(grpc_receiver: Receiver, short_tmp: Path) -> None:
    """Logs over OTLP/HTTP to their endpoint, metrics over gRPC to theirs, as the spec's
    per-signal variables say; the gRPC endpoint is used as it is, without /v1/metrics."""
    variables = {
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": f"{grpc_receiver.url}/v1/logs",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": grpc_receiver.grpc_url,
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-tenant=t1",
    }
    relay = relay_for(variables, short_tmp)
    try:
        export_a_round(relay.container_env(variables))
    finally:
        relay.stop()
    assert arrived(grpc_receiver) == (["round 1: loss 2.5000"], {2.5})
    paths = {path: headers for path, headers in grpc_receiver.requests}
    assert set(paths) == {"/v1/logs", GRPC_PATHS[1]}
    assert paths[GRPC_PATHS[1]]["x-tenant"] == "t1" and "x-tenant" not in paths["/v1/logs"]


@pytest.mark.parametrize(
    ("endpoint", "insecure", "route"),
    [
        ("http://c:4317", None, GrpcRoute("c:4317", secure=False)),
        ("http://c:4317/", "false", GrpcRoute("c:4317", secure=False)),
        ("https://c:4317", "true", GrpcRoute("c:4317", secure=True)),  # the scheme decides
        ("c:4317", None, GrpcRoute("c:4317", secure=True)),  # no scheme: TLS by default
        ("c:4317", "true", GrpcRoute("c:4317", secure=False)),
    ],
)
def test_a_grpc_endpoint_and_its_tls_follow_the_exporter_spec(
    endpoint: str, insecure: str | None, route: GrpcRoute
) -> None:
    assert grpc_route(endpoint, insecure) == route
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    upstream = upstream_from(env | ({"OTEL_EXPORTER_OTLP_INSECURE": insecure} if insecure else {}))
    assert upstream is not None and upstream.urls == {}
    assert upstream.grpc == {"logs": route, "metrics": route, "traces": route}


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [("unix:///run/otel.sock", "neither http:// nor https://"), ("http:///v1", "names no host")],
)
def test_a_grpc_endpoint_the_relay_cannot_call_is_one_line(endpoint: str, why: str) -> None:
    with pytest.raises(TelemetryConfigError, match=why):
        upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})  # fmt: skip


def test_an_unreachable_grpc_collector_answers_a_status_the_exporter_retries(
    short_tmp: Path,
) -> None:
    from hypha.accelerate_executor.telemetry.otlp_unix import RELAY_URL, unix_session

    variables = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}  # fmt: skip
    relay = relay_for(variables, short_tmp)
    try:
        answer = unix_session(relay.socket_path).post(f"{RELAY_URL}/v1/logs", data=b"", timeout=30)
    finally:
        relay.stop()
    assert answer.status_code == 503


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, by openssl."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_an_https_grpc_endpoint_is_called_over_tls_trusting_the_configured_ca(
    short_tmp: Path,
) -> None:
    import grpc

    cert, key = self_signed(short_tmp)
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    with otlp_endpoint(grpc=True, grpc_credentials=credentials) as receiver:
        assert receiver.grpc_url.startswith("https://")
        variables = telemetry_variables(receiver.grpc_url, "grpc")
        # Without the CA the server's certificate is not trusted: nothing arrives.
        relay = relay_for(variables, short_tmp)
        try:
            from hypha.accelerate_executor.telemetry.otlp_unix import RELAY_URL, unix_session

            answer = unix_session(relay.socket_path).post(f"{RELAY_URL}/v1/logs", data=b"")
            assert answer.status_code == 503
        finally:
            relay.stop()
        relay = relay_for(variables | {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert)}, short_tmp)
        try:
            export_a_round(relay.container_env(variables))
        finally:
            relay.stop()
    assert arrived(receiver) == (["round 1: loss 2.5000"], {2.5})


def test_a_missing_ca_file_is_one_line(short_tmp: Path) -> None:
    with pytest.raises(TelemetryConfigError, match=r"OTEL_EXPORTER_OTLP_CERTIFICATE=.*absent\.pem"):
        upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE": str(short_tmp / "absent.pem")})  # fmt: skip


def test_the_shim_imports_grpcio_only_when_grpc_is_asked_for() -> None:
    """The shim starts fast: reading the settings imports neither grpcio nor torch."""
    code = (
        "import sys\n"
        "import hypha.accelerate_executor.shim.run\n"
        "from hypha.accelerate_executor.shim.otlp_upstream import upstream_from\n"
        "assert upstream_from({'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://c:4317',"
        " 'OTEL_EXPORTER_OTLP_PROTOCOL': 'grpc'}).grpc\n"
        "print(sorted(m for m in ('grpc', 'torch') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.strip() == "[]", run.stderr


def test_without_grpcio_the_relay_refuses_in_one_line(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "hypha.accelerate_executor.shim.otlp_grpc", None)
    upstream = upstream_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})  # fmt: skip
    assert upstream is not None
    with pytest.raises(TelemetryConfigError, match=r"grpcio .*\[shim\] extra"):
        OtlpRelay(str(short_tmp), upstream, (os.getuid(), os.getgid()))
    assert list(short_tmp.iterdir()) == []


def test_an_executor_on_the_host_exports_over_grpc_itself(
    grpc_receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No relay: the SDK's own OTLP/gRPC exporters, reading the variables as they do."""
    for name, value in telemetry_variables(grpc_receiver.grpc_url, "grpc").items():
        monkeypatch.setenv(name, value)
    export_a_round(dict(os.environ))
    assert arrived(grpc_receiver) == (["round 1: loss 2.5000"], {2.5})
    assert {path for path, _ in grpc_receiver.requests} == set(GRPC_PATHS)
    assert {h["authorization"] for _, h in grpc_receiver.requests} == {f"Bearer {HEADER_SECRET}"}


def test_an_executor_on_the_host_without_the_grpc_exporter_says_so_and_trains(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hypha.accelerate_executor.telemetry as telemetry

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc", None)
    monkeypatch.setattr(telemetry, "_active", None)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    telemetry.start("job-7", env)
    assert telemetry._active is None
    assert capsys.readouterr().out == (
        "warning: telemetry off: OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs "
        "opentelemetry-exporter-otlp-proto-grpc in the executor's environment "
        "(under the shim, gRPC is relayed without it)\n"
    )


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
    from hypha.standin.coordinator.server import Catalog, RunOptions, coordinator_class
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.worker.executor_entries import preset
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    class MissingModel(coordinator_class("actions")):
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


def test_the_receivers_command_serves_grpc_and_prints_what_arrives(short_tmp: Path) -> None:
    """`python -m hypha.standin.otlp_receiver --grpc-listen`, as an operator runs it."""
    receiver = subprocess.Popen(
        [sys.executable, "-m", "hypha.standin.otlp_receiver", "--listen", "127.0.0.1:0",
         "--grpc-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().startswith("otlp-receiver: OTLP/HTTP on http://")
        announced = receiver.stdout.readline().strip()
        assert announced.startswith("otlp-receiver: OTLP/gRPC on http://127.0.0.1:"), announced
        variables = telemetry_variables(announced.rpartition(" ")[2], "grpc")
        relay = relay_for(variables, short_tmp)
        try:
            export_a_round(relay.container_env(variables))
        finally:
            relay.stop()
    finally:
        receiver.terminate()
        out, err = receiver.communicate(timeout=30)
    assert "log INFO round 1: loss 2.5000 [" in out, (out, err)
    assert "metric hypha.training.loss 2.5 [" in out


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (["--listen", "192.0.2.1:4318"], "otlp-receiver: cannot listen on ('192.0.2.1', 4318): "),
        (["--listen", "127.0.0.1:0", "--grpc-listen", "192.0.2.1:4317"],
         "otlp-receiver: cannot listen on 192.0.2.1:4317 for OTLP/gRPC"),
    ],
)  # fmt: skip
def test_the_receiver_that_cannot_listen_says_so_in_one_line(
    arguments: list[str], line: str
) -> None:
    """192.0.2.1 (TEST-NET-1) is no address of this host: neither side can bind it."""
    run = subprocess.run(
        [sys.executable, "-m", "hypha.standin.otlp_receiver", *arguments],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    ours = [text for text in run.stderr.splitlines() if text.startswith("otlp-receiver:")]
    assert len(ours) == 1 and ours[0].startswith(line), run.stderr
    assert "Traceback" not in run.stderr
