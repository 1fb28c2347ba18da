"""Cancellation and crashes: what the worker's SIGTERM (then SIGKILL 5 s later) leaves behind."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from typing import Any

import pytest

from shim_harness import WorkerJob, wait_for_line, wait_until

pytestmark = pytest.mark.docker


def _cancel(job: WorkerJob, api: Any, signum: int) -> tuple[int, float, bytes, bytes]:
    """Starts a job, signals the shim once the executor runs; returns the shim's exit code,
    seconds from the signal until the container is gone and the shim has exited, output."""
    process = job.start()
    wait_for_line(process, b"ready")
    start = time.monotonic()
    process.send_signal(signum)
    out, err = process.communicate(timeout=10)
    wait_until(lambda: not job.containers(api), timeout=10)
    return process.returncode, time.monotonic() - start, out, err


@pytest.mark.slow
def test_sigterm_removes_the_container_within_3_s(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    worker_job.plan(sleep=120)
    took = []
    for _ in range(20):
        code, seconds, out, err = _cancel(worker_job, docker_api, signal.SIGTERM)
        assert code == 143, err
        assert out == b"got SIGTERM\n"  # the rest after "ready"
        assert err.decode().splitlines() == [
            "hypha-accelerate run: cancelled by SIGTERM; container stopped (exit 143)"
        ]
        took.append(seconds)
    assert max(took) < 3.0, took
    assert worker_job.containers(docker_api) == []


def test_sigint_exits_130(fake_image: str, worker_job: WorkerJob, docker_api: Any) -> None:
    worker_job.plan(sleep=120)
    code, seconds, _, _ = _cancel(worker_job, docker_api, signal.SIGINT)
    assert code == 130
    assert seconds < 3.0


def test_executor_ignoring_sigterm_is_killed_within_the_workers_grace(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    worker_job.plan(sleep=120, on_sigterm="ignore")
    code, seconds, _, err = _cancel(worker_job, docker_api, signal.SIGTERM)
    assert code == 143
    assert b"exit 137" in err
    assert seconds < 5.0  # the worker's SIGKILL comes at 5 s


@pytest.mark.slow
def test_sigterm_at_any_moment_leaves_nothing(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    """Signals landing during start-up (imports, create, start) as well as during the run."""
    worker_job.plan(sleep=120)
    rng = random.Random(7)
    for _ in range(8):
        process = worker_job.start()
        time.sleep(rng.uniform(0.0, 1.5))
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=10)
        # Before the handlers exist the default action ends the shim (no container yet).
        assert process.returncode in (143, -signal.SIGTERM)
        wait_until(lambda: not worker_job.containers(docker_api), timeout=5)


@pytest.mark.slow
def test_sigkill_then_bridge_gone_leaves_no_container(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    took = []
    for _ in range(10):
        worker_job.plan(sleep=120)
        process = worker_job.start()
        wait_for_line(process, b"ready")
        process.kill()
        process.wait()
        worker_job.bridge_away()
        took.append(wait_until(lambda: not worker_job.containers(docker_api), timeout=15))
        worker_job.serve_bridge()
    assert max(took) < 15, took
    assert worker_job.containers(docker_api) == []


def test_stale_containers_of_dead_shims_are_removed(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    from hypha.accelerate_executor.shim.engine import remove_container
    from hypha.accelerate_executor.shim.reaper import shim_labels

    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = shim_labels()  # this test process: alive
    stale_labels = [
        {**mine, "hypha.accelerate.shim-pid": str(dead.pid)},
        # pid alive but started at another time: a reused pid
        {**mine, "hypha.accelerate.shim-start": "not-this-process"},
    ]
    label = {"hypha.accelerate.job-id": worker_job.job_id}
    stale = [
        docker_api.create_container(fake_image, labels={**labels, **label})["Id"]
        for labels in stale_labels
    ]
    alive = docker_api.create_container(fake_image, labels={**mine, **label})["Id"]
    other_host = docker_api.create_container(
        fake_image,
        labels={
            **mine,
            "hypha.accelerate.shim-pid": str(dead.pid),
            "hypha.accelerate.shim-host": "elsewhere",
            **label,
        },
    )["Id"]
    try:
        worker_job.plan()
        assert worker_job.run().returncode == 0
        left = {c["Id"] for c in worker_job.containers(docker_api)}
        assert left == {alive, other_host}, (left, stale)
    finally:
        for container in (*stale, alive, other_host):
            remove_container(docker_api, container)
