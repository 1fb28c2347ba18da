"""End to end in the container: a 2-round DiLoCo job of the cpu image against the local
stand-in of the Hypha side, started the way a worker's TOML entry starts it (docker run as
the worker's uid, hardened, WORK_DIR bind-mounted at the same path), with a cancellation
that must end on SIGTERM, and with two CPU ranks through accelerate launch."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from image_harness import ARBITRARY_USER, HARDENED

from hypha.accelerate_executor.local.assets import ensure_assets
from hypha.accelerate_executor.local.coordinator import Catalog, Coordinator, RunOptions
from hypha.accelerate_executor.local.coordinator_client import CoordinatorClient
from hypha.accelerate_executor.local.worker import (
    EXECUTOR_ARGS,
    ExecutorEntry,
    LocalWorker,
    serve_one_job,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

WORKER_UID, WORKER_GID = (int(part) for part in ARBITRARY_USER.split(":"))


def docker_entry(image: str, *launcher_args: str) -> ExecutorEntry:
    """The worker TOML's docker entry (shared/examples/worker-executors.toml, no --init)."""
    return ExecutorEntry(
        "docker",
        (
            "run",
            "--rm",
            "--user",
            ARBITRARY_USER,
            *HARDENED,
            "--volume",
            "{WORK_DIR}:{WORK_DIR}",
            image,
            *EXECUTOR_ARGS,
            *launcher_args,
        ),
    )


@pytest.fixture
def work_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Short (the socket path must fit 107 bytes) and traversable by the worker's uid.
    base = Path(f"/tmp/hypha-img-{os.getpid()}")
    base.mkdir(mode=0o755)
    yield base
    for leftover in base.iterdir():
        pytest.fail(f"work dir left behind: {leftover}")
    base.rmdir()


def run_job(
    entry: ExecutorEntry, work_base: Path, options: RunOptions, cancel_after_batches: int = 0
) -> dict[str, Any]:
    coordinator = Coordinator(Catalog.from_assets(ensure_assets()), options)
    coordinator.start()
    try:
        worker = LocalWorker("w1", entry, work_base, owner=(WORKER_UID, WORKER_GID))
        if cancel_after_batches:
            threading.Thread(
                target=cancel_when_training,
                args=(coordinator, worker, cancel_after_batches),
                daemon=True,
            ).start()
        serve_one_job(CoordinatorClient(coordinator.url), worker)
        return dict(coordinator.summary()["workers"]["w1"])
    finally:
        coordinator.stop()


def cancel_when_training(coordinator: Coordinator, worker: LocalWorker, batches: int) -> None:
    while (
        coordinator.summary()["workers"].get("w1", {}).get("rounds", [{}])[0].get("batches", 0)
        < batches
    ):
        time.sleep(0.2)
    worker.cancel()


def test_two_round_diloco_job_in_the_container(cpu_image: str, work_base: Path) -> None:
    record = run_job(
        docker_entry(cpu_image), work_base, RunOptions(workers=1, rounds=2, steps_per_round=4)
    )
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert sorted(record["metrics"]) == [1, 2]
    # Deleted as the worker's uid: anything the container made that it cannot delete shows.
    assert record["leaks"] == []


def test_a_cancelled_job_ends_on_sigterm_before_the_sigkill(
    cpu_image: str, work_base: Path
) -> None:
    # SIGTERM reaches only `docker run`, which passes it to the launcher (PID 1, no --init),
    # which passes it to the training process group. 143, not 137: no SIGKILL was needed.
    record = run_job(
        docker_entry(cpu_image),
        work_base,
        RunOptions(workers=1, rounds=1, steps_per_round=100_000),
        cancel_after_batches=2,
    )
    assert record["exit_code"] == 143
    assert record["leaks"] == []


def test_two_cpu_ranks_through_accelerate_launch_in_the_container(
    cpu_image: str, work_base: Path
) -> None:
    record = run_job(
        docker_entry(cpu_image, "--accelerate-config", "multi-cpu", "--num-processes", "2"),
        work_base,
        RunOptions(workers=1, rounds=2, steps_per_round=4),
    )
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert record["leaks"] == []
