"""Telemetry out of the executor's container, which has no network (docs/telemetry.md): a
two-worker, two-round job through the shim in the cpu image, with the OTEL_* variables a
later Hypha worker passes, exporting to a real OTLP endpoint on loopback through the shim's
relay, over OTLP/HTTP and over OTLP/gRPC; and the same job without them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.platform.image_tags import image_tags
from hypha.accelerate_executor.telemetry import SOCKET_VARIABLE
from shim_harness import WORKER_GID, WORKER_UID
from telemetry_job import (
    GRPC_PATHS,
    HEADER_SECRET,
    check_arrived,
    otlp_endpoint,
    rounds_printed,
    run_two_workers,
    telemetry_variables,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def image(docker_api: Any) -> str:
    """The cpu image (HYPHA_TEST_IMAGE: another tag of it), which must carry the SDK."""
    tag = os.environ.get("HYPHA_TEST_IMAGE") or image_tags("cpu")[0]
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python",
         tag, "-c", "import opentelemetry.exporter.otlp.proto.http, opentelemetry.sdk"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.fail(
            f"{tag} lacks the OpenTelemetry SDK or is missing: `hypha-accelerate build cpu "
            f"--offline` rebuilds it ({probe.stderr.strip()[-300:]})"
        )
    return tag


@pytest.fixture
def job_base(work_base: Path) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(dir=work_base))
    base.chmod(0o755)
    yield base
    assert list(base.iterdir()) == [], "work dirs left behind"
    base.rmdir()


class Watch:
    """What the host shows while the job runs: every process's command line, and each of
    the job's executor containers as `docker inspect` describes it."""

    def __init__(self, api: Any, base: Path) -> None:
        self.api, self.base = api, base
        self.command_lines: set[str] = set()
        self.inspected: dict[str, dict[str, Any]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.2):
            ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True)
            self.command_lines.update(ps.stdout.splitlines())
            for container in self.api.containers(filters={"label": "hypha.accelerate.work-dir"}):
                if container["Labels"]["hypha.accelerate.work-dir"].startswith(f"{self.base}/"):
                    with contextlib.suppress(Exception):  # removed meanwhile
                        self.inspected[container["Id"]] = self.api.inspect_container(
                            container["Id"]
                        )

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def run_job(
    image: str,
    base: Path,
    api: Any,
    variables: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    out: Path,
) -> Watch:
    from hypha.standin.worker.executor_entries import preset

    monkeypatch.setenv("HYPHA_ACCELERATE_IMAGE", image)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with Watch(api, base) as watch:
        run_two_workers(preset("shim"), base, out, owner=(WORKER_UID, WORKER_GID))
    assert len(watch.inspected) == 2, "the watch missed an executor container"
    for described in watch.inspected.values():
        assert described["HostConfig"]["NetworkMode"] == "none"
        assert described["Config"]["User"] == f"{WORKER_UID}:{WORKER_GID}"
    return watch


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_job_through_the_shim_exports_through_the_relay_and_keeps_the_token_out(
    protocol: str,
    image: str,
    job_base: Path,
    docker_api: Any,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """With grpc, the same container (it posts OTLP/HTTP protobuf to the relay) and a gRPC
    collector: the relay on the host makes each export a gRPC call, the header metadata."""
    grpc = protocol == "grpc"
    with otlp_endpoint(grpc=grpc) as receiver:
        variables = telemetry_variables(receiver.grpc_url if grpc else receiver.url, protocol)
        watch = run_job(image, job_base, docker_api, variables, monkeypatch, tmp_path)
    printed = capfd.readouterr()
    if grpc:
        check_arrived(receiver, printed.out, paths=GRPC_PATHS)
    else:
        check_arrived(receiver, printed.out)
    for described in watch.inspected.values():
        env = dict(line.split("=", 1) for line in described["Config"]["Env"])
        assert env[SOCKET_VARIABLE].endswith("/otlp.sock")
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
        assert "OTEL_EXPORTER_OTLP_HEADERS" not in env
    # The token: in no command line, inspect output, output of the job or file it left.
    assert any("hypha.accelerate_executor.training" in line for line in watch.command_lines)
    assert not [line for line in watch.command_lines if HEADER_SECRET in line]
    assert HEADER_SECRET not in json.dumps(list(watch.inspected.values()))
    assert HEADER_SECRET not in printed.out + printed.err
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or HEADER_SECRET.encode() not in path.read_bytes(), path


def test_the_same_job_without_the_variables_exports_nothing(
    image: str,
    job_base: Path,
    docker_api: Any,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    with otlp_endpoint() as receiver:
        watch = run_job(image, job_base, docker_api, {}, monkeypatch, tmp_path)
    rounds_printed(capfd.readouterr().out, "alpha17")
    assert receiver.requests == []
    for described in watch.inspected.values():
        assert not any(
            line.startswith((SOCKET_VARIABLE, "OTEL_")) for line in described["Config"]["Env"]
        )
