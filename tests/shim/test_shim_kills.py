"""The worst ways a shim can die, and many shims at once: no container is left behind.

A shim that dies with its watchdog (a group kill, the OOM killer) leaves a container that
only the executor (its bridge gone) and the next shim's reaper can end; a shim killed
between creating its container and starting it leaves a created container for its
watchdog, or the next shim's reaper.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim_harness import WorkerJob, new_worker_job, wait_for_line, wait_until

pytestmark = pytest.mark.docker

CLEANUP_SECONDS = 15  # what the worker's host may take to be clean again


def _watchdog_of(shim_pid: int) -> int:
    """The watchdog the shim started (a child in its own session)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == shim_pid and b"shim.watchdog" in cmdline:
            return int(entry.name)
    raise AssertionError(f"shim {shim_pid} has no watchdog")


def _kill_group(pid: int) -> None:
    os.killpg(os.getpgid(pid), signal.SIGKILL)


def _next_shim_runs(base: Path) -> None:
    """Another job on the same host, to its end: its shim reaps what dead shims left."""
    job = new_worker_job(base)
    result = job.run()
    assert result.returncode == 0, result.stderr
    job.bridge_away()


def test_shim_and_watchdog_killed_together_leave_no_container(
    fake_image: str, worker_job: WorkerJob, docker_api: Any, work_base: Path
) -> None:
    worker_job.plan(sleep=120)
    shim = worker_job.start(process_group=0)
    wait_for_line(shim, b"ready")
    watchdog = _watchdog_of(shim.pid)
    killed_at = time.monotonic()
    _kill_group(shim.pid)
    _kill_group(watchdog)
    shim.wait(timeout=5)
    worker_job.bridge_away()  # what the worker does once its child is gone
    [container] = worker_job.containers(docker_api)
    wait_until(
        lambda: docker_api.inspect_container(container["Id"])["State"]["Status"] == "exited",
        timeout=10,
    )  # the executor noticed the bridge is gone
    _next_shim_runs(work_base)
    assert worker_job.containers(docker_api) == []
    assert time.monotonic() - killed_at < CLEANUP_SECONDS


class StartHoldingProxy:
    """A Docker engine socket that passes everything on but never a container's start, so
    that a shim can be caught between create and start."""

    START = re.compile(rb"POST /v[\d.]+/containers/[0-9a-f]+/start ")

    def __init__(self, path: Path, engine: str = "/var/run/docker.sock") -> None:
        self.path, self.engine = path, engine
        self.start_held = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.engine)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if requests and self.START.search(chunk):
                    self.start_held.set()
                    return  # held: the start never reaches the engine
                sink.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[StartHoldingProxy]:
    held = StartHoldingProxy(tmp_path / "docker.sock")
    yield held
    held.close()


@pytest.mark.parametrize("watchdog_too", [False, True], ids=["shim", "shim-and-watchdog"])
def test_shim_killed_between_create_and_start_leaves_no_container(
    fake_image: str,
    worker_job: WorkerJob,
    docker_api: Any,
    work_base: Path,
    proxy: StartHoldingProxy,
    watchdog_too: bool,
) -> None:
    worker_job.plan(sleep=120)
    shim = worker_job.start(process_group=0, env={"DOCKER_HOST": f"unix://{proxy.path}"})
    assert proxy.start_held.wait(timeout=30), shim.stderr.read() if shim.stderr else ""
    [container] = worker_job.containers(docker_api)
    assert container["State"] == "created"
    killed_at = time.monotonic()
    if watchdog_too:
        _kill_group(_watchdog_of(shim.pid))
    _kill_group(shim.pid)
    shim.wait(timeout=5)
    worker_job.bridge_away()
    if watchdog_too:
        _next_shim_runs(work_base)
    wait_until(lambda: not worker_job.containers(docker_api), timeout=CLEANUP_SECONDS)
    assert time.monotonic() - killed_at < CLEANUP_SECONDS


def test_six_jobs_at_once_all_finish_in_their_own_containers(
    fake_image: str, docker_api: Any, work_base: Path
) -> None:
    jobs = [new_worker_job(work_base) for _ in range(6)]
    for job in jobs:
        job.plan(lines=20, write_files=True)
    shims = [job.start() for job in jobs]  # as one host's worker starts them: all at once
    containers = set()
    for job, shim in zip(jobs, shims, strict=True):
        out, err = shim.communicate(timeout=120)
        assert shim.returncode == 0, err
        lines = out.decode().splitlines()
        assert f"job id {job.job_id}" in lines and "line 19" in lines
        containers |= {line for line in lines if line.startswith("container ")}
        assert job.containers(docker_api) == []
        job.bridge_away()
    assert len(containers) == 6
    pids = {str(shim.pid) for shim in shims}
    left = docker_api.containers(all=True, filters={"label": "hypha.accelerate.shim-pid"})
    assert not [c for c in left if c["Labels"]["hypha.accelerate.shim-pid"] in pids]
