"""Benchmark 5: the executor's samples/s when the scheduler's answers take their time.

A Hypha worker forwards each `status` over the network to the scheduler, so an answer takes
20-100 ms, where the local stand-in answers in well under one. Here the stand-in's answers
to every Progress message are held back by 0, 20 and 100 ms (a wrapper around the bridge's
backend, nothing else changes), and the executor trains the demo job as a process under a
local worker. Measured: the median samples/s of rounds 2.. (the executor's own metrics)
against the same with no delay, and how many batches the executor trained past the
ScheduleUpdate's counter because its answer came late (the round line's overshoot). The
delays run in turns, repeated, so that the machine's drift falls on all of them alike; the
executor runs torch on one thread.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.models import Shape
from hypha.selftest.runs import LateAnswers
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.demo import supervise
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

DELAYS_MS = (0, 20, 100)


@dataclass
class StatusDelayResult:
    model: str
    batch_size: int
    steps_per_round: int
    delay_ms: int
    samples_per_s: list[float]  # each repeat's median over rounds 2..
    overshoot: list[int]  # batches past ScheduleUpdate, summed over each repeat's rounds
    rounds: int

    @property
    def median_samples_per_s(self) -> float:
        return statistics.median(self.samples_per_s)


def serve_delayed(
    coordinator: Coordinator, worker: LocalWorker, delay_s: float, failures: list[BaseException]
) -> None:
    """Serves one job on `worker`, every status answer held back `delay_s`; a failure is
    appended to `failures` (this runs on a thread of its own)."""
    try:
        serve_one_job(
            CoordinatorClient(coordinator.url),
            worker,
            backend=lambda job: LateAnswers(coordinator.backend(job), delay_s),
        )
    except Exception as exc:
        failures.append(exc)


def one_run(
    shape: Shape, delay_ms: int, options: RunOptions, work_base: Path, timeout_s: float
) -> tuple[float, int]:
    """The executor's median samples/s over rounds 2.. and its total overshoot."""
    assets = ensure_assets(spec=shape.asset_spec())
    with build_coordinator(
        Catalog.from_assets(assets), options, name="bench-coordinator"
    ) as coordinator:
        # One torch thread: on a loaded machine, two would spin against the others' work,
        # and the ratio would measure the machine instead of the executor.
        worker = LocalWorker(
            "bench-worker", preset("process"), work_base, env={"OMP_NUM_THREADS": "1"}
        )
        failure: list[BaseException] = []
        thread = threading.Thread(
            target=serve_delayed,
            args=(coordinator, worker, delay_ms / 1e3, failure),
            name="bench-worker",
            daemon=True,
        )
        thread.start()
        supervise(coordinator, lambda: not thread.is_alive(), timeout_s)
        record = coordinator.summary()["workers"]["bench-worker"]
    if failure or record["exit_code"] != 0:
        raise BenchError(f"the executor failed at a {delay_ms} ms delay: {failure or record}")
    overshoot = sum(int(m.get("overshoot_batches", 0)) for m in record["metrics"].values())
    return median_samples_per_s(record), overshoot


def median_samples_per_s(record: dict[str, Any]) -> float:
    """The median of the samples/s a worker's executor reported for rounds 2.. (the
    coordinator's record of it): the first round warms up."""
    rates = [m["samples_per_second"] for key, m in record["metrics"].items() if int(key) > 1]
    if not rates:
        raise BenchError("the executor reported no metrics after its first round")
    return statistics.median(rates)


def run(
    work_base: Path,
    shape: Shape,
    options: RunOptions,
    repeats: int,
    delays_ms: tuple[int, ...] = DELAYS_MS,
    timeout_s: float = 900.0,
) -> list[StatusDelayResult]:
    results = {
        delay: StatusDelayResult(
            shape.name, options.batch_size, options.steps_per_round, delay, [], [], options.rounds
        )
        for delay in delays_ms
    }
    # The executor's and the coordinator's lines would break up the results table.
    with contextlib.redirect_stdout(sys.stderr):
        for _ in range(repeats):
            for delay in delays_ms:
                rate, overshoot = one_run(shape, delay, options, work_base, timeout_s)
                results[delay].samples_per_s.append(rate)
                results[delay].overshoot.append(overshoot)
    return list(results.values())
