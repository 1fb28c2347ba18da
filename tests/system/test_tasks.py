"""The task matrix: every task that trains (tasks.py) trained by the executor, in this process,
over three rounds of the local stand-in (scheduler, bridge, parameter server), with a tiny
random-init model of its own; its loss falls. Many tasks in one process keep it cheap."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from hypha.accelerate_executor.protocol.alpha17.job import parse_job
from hypha.accelerate_executor.protocol.tasks import TASKS, Trains
from hypha.standin.alpha17.bridge_http import Alpha17BridgeServer as BridgeServer
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.server import RunOptions, build_coordinator
from task_models import CASES, TaskCase

pytestmark = pytest.mark.slow
OPTIONS = RunOptions(
    workers=1, rounds=3, steps_per_round=6, batch_size=8, learning_rate=1e-2,
    lr_schedule="constant", outer_momentum=0.5, generation="alpha17",
)  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """As the stand-in runs its executors (OMP_NUM_THREADS=1): tiny models on a shared 2-core
    machine go faster on one thread than fighting over two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_task_that_trains_has_a_case() -> None:
    trainable = [task for task, entry in TASKS.items() if isinstance(entry, Trains)]
    assert sorted(case.task for case in CASES) == sorted(trainable)


def train(case: TaskCase, root: Path, socket_dir: Path) -> list[float]:
    """Trains the case's job through the stand-in; the loss of every round."""
    from hypha.accelerate_executor.training.alpha17.loop import Trainer
    from hypha.accelerate_executor.training.settings import RunSettings

    with build_coordinator(case.write_catalog(root), replace(OPTIONS)) as coordinator:
        client = CoordinatorClient(coordinator.url)
        job: dict[str, Any] = json.loads(client.request_job("w1"))
        case.retarget(job)
        work_dir = socket_dir / case.task  # a Unix socket's path must stay short
        work_dir.mkdir()
        with BridgeServer(work_dir, client.backend(job["job_id"])) as bridge:
            job_spec = parse_job(json.dumps(job))
            # HYPHA_COMPILE=on runs the matrix compiled (slow on a CPU: not in the default run).
            compile = os.environ.get("HYPHA_COMPILE") or "off"
            run = RunSettings(bridge.socket_path, work_dir, "float32", compile=compile)
            Trainer(job_spec, run).run()
        metrics = coordinator.summary()["workers"]["w1"]["metrics"]
    return [round_metrics["loss"] for _, round_metrics in sorted(metrics.items())]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.task)
def test_the_task_trains(case: TaskCase, tmp_path: Path, short_tmp: Path) -> None:
    started = time.perf_counter()
    losses = train(case, tmp_path, short_tmp)
    seconds = time.perf_counter() - started
    print(f"{case.task}: {case.model} losses {[round(loss, 4) for loss in losses]} {seconds:.1f} s")
    assert len(losses) == OPTIONS.rounds
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < 0.95 * losses[0], losses
