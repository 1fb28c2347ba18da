"""End to end in the container: a 2-round DiLoCo job of the cpu image against the local
stand-in of the Hypha side, started the way a worker's TOML entry starts it (docker run as
the worker's uid, hardened, WORK_DIR bind-mounted at the same path), with a cancellation
that must end on SIGTERM, and with two CPU ranks through accelerate launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypha.standin.coordinator.server import RunOptions
from image_harness import docker_entry, run_job

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_two_round_diloco_job_in_the_container(cpu_image: str, work_base: Path) -> None:
    record = run_job(
        docker_entry(cpu_image),
        work_base,
        RunOptions(workers=1, rounds=2, steps_per_round=4, generation="alpha17"),
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
        RunOptions(workers=1, rounds=1, steps_per_round=100_000, generation="alpha17"),
        cancel_after_batches=2,
    )
    assert record["exit_code"] == 143
    assert record["leaks"] == []


def test_two_cpu_ranks_through_accelerate_launch_in_the_container(
    cpu_image: str, work_base: Path
) -> None:
    # Also the proof that the slimmed image still trains with several processes.
    record = run_job(
        docker_entry(cpu_image, "--accelerate-config", "multi-cpu", "--num-processes", "2"),
        work_base,
        RunOptions(workers=1, rounds=2, steps_per_round=8, generation="alpha17"),
    )
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert record["metrics"][2]["loss"] < record["metrics"][1]["loss"]
    assert record["leaks"] == []
