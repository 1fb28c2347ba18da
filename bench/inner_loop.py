"""Benchmark 1: the executor's training throughput against a bare PyTorch loop.

The executor runs a real job as a process under a local worker, against the local
cluster's coordinator (one worker); its samples/s come from the `metrics` messages it
sends each round, which the coordinator records. The bare loop trains the same model
from the same files with the same AdamW settings and LR schedule on the same batch
size, its data already in memory, with no bridge and no accelerate. Both drop their
first round (warm-up) and take the median of the other rounds' samples/s, so one round
slowed by another process does not decide the figure. The bare loop runs once before
and once after the executor, and its baseline is the mean of the two, so drift on a
shared machine shows up in their spread instead of in the ratio.

The local bridge and coordinator run in this process, on the same cores as the
executor: the CPU this process spends while the executor trains (its timed rounds) is
recorded per step, being a part of the gap that a Hypha worker's own bridge would not
cost the same. The bridge is the real one on its Unix socket, but it reaches the
coordinator by direct calls (InProcessBackend), not through the coordinator's TCP API: a
Hypha worker forwards each `status` to a scheduler on another machine, while here the
stand-in scheduler's HTTP server, and the bridge's HTTP client to it, would run on the
executor's two cores and cost them three times what the bridge itself does per `status`
(0.36 ms of CPU against 0.11 ms, both with kept-alive connections).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.models import Shape, parameter_count
from bench.timing import CpuSampler
from hypha.accelerate_executor.protocol.alpha17.job import parse_job
from hypha.accelerate_executor.training.modeling import load_model
from hypha.selftest.runs import bare_loop, training_device
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.demo import supervise
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job


@dataclass
class InnerLoopResult:
    model: str
    parameters: int
    batch_size: int
    steps_per_round: int
    executor_rounds: list[float]  # samples/s of each timed round
    bare_rounds: list[list[float]]  # the same, before and after the executor
    stand_in_cpu_ms_per_step: float
    mixed_precision: str  # "no" or "bf16", in both loops
    device: str  # the bare loop's; the executor takes accelerate's default, the same one
    # Every repeat's ratio, lowest first; this result is the median one's.
    repeat_ratios: list[float] = field(default_factory=list)

    @property
    def executor_samples_per_s(self) -> float:
        return statistics.median(self.executor_rounds)

    @property
    def bare_samples_per_s(self) -> list[float]:
        return [statistics.median(rounds) for rounds in self.bare_rounds]

    @property
    def baseline_samples_per_s(self) -> float:
        return sum(self.bare_samples_per_s) / len(self.bare_samples_per_s)

    @property
    def ratio(self) -> float:
        return self.executor_samples_per_s / self.baseline_samples_per_s

    @property
    def bare_steps_per_s(self) -> float:
        return self.baseline_samples_per_s / self.batch_size


def executor_run(
    coordinator: Coordinator, work_base: Path, timeout_s: float, mixed_precision: str
) -> tuple[dict[str, Any], float]:
    """Runs the coordinator's one job through a local worker: the worker's summary entry,
    and this process's CPU time per step of the executor's timed rounds, in seconds."""
    client = CoordinatorClient(coordinator.url)
    # accelerate's own setting, which an accelerate config would otherwise give.
    environment = {"ACCELERATE_MIXED_PRECISION": mixed_precision}
    worker = LocalWorker("bench-worker", preset("process"), work_base, env=environment)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            serve_one_job(client, worker, backend=coordinator.backend)
        except Exception as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve, name="bench-worker", daemon=True)
    with CpuSampler() as sampler:
        thread.start()
        supervise(coordinator, lambda: not thread.is_alive(), timeout_s)
    if failure:
        raise BenchError(f"the local worker failed: {failure[0]}")
    record: dict[str, Any] = coordinator.summary()["workers"]["bench-worker"]
    if record["exit_code"] != 0:
        raise BenchError(f"the executor exited with {record['exit_code']} (its stderr is above)")
    # The coordinator's round 0 is the executor's round 1, the warm-up.
    windows = [(r["first_status_at"], r["update_at"]) for r in record["rounds"][1:]]
    if not windows or any(start is None or end is None for start, end in windows):
        raise BenchError("the coordinator recorded no complete round after the first")
    cpu = sum(sampler.cpu_between(start, end) for start, end in windows)
    steps = sum(m["batches"] for key, m in record["metrics"].items() if int(key) > 1)
    return record, cpu / max(steps, 1)


def executor_rounds(record: dict[str, Any]) -> list[float]:
    """Samples/s of rounds 2.. as the executor reported them in its metrics."""
    rounds = sorted((int(key), metrics) for key, metrics in record["metrics"].items())
    rates = [metrics["samples_per_second"] for key, metrics in rounds if key > 1]
    if not rates:
        raise BenchError("the executor reported no metrics after its first round")
    return rates


def measure(
    shape: Shape,
    steps_per_round: int,
    rounds: int,
    work_base: Path,
    timeout_s: float,
    mixed_precision: str,
) -> InnerLoopResult:
    assets = ensure_assets(spec=shape.asset_spec())
    options = RunOptions(
        workers=1, rounds=rounds, steps_per_round=steps_per_round, generation="alpha17"
    )
    with build_coordinator(
        Catalog.from_assets(assets), options, name="bench-coordinator"
    ) as coordinator:
        job = parse_job(json.dumps(coordinator.job_spec(str(uuid.uuid4()))))
        before = bare_loop(job, assets, steps_per_round, rounds, mixed_precision)
        record, stand_in_cpu_s = executor_run(coordinator, work_base, timeout_s, mixed_precision)
        after = bare_loop(job, assets, steps_per_round, rounds, mixed_precision)
    return InnerLoopResult(
        model=shape.name,
        parameters=parameter_count(load_model(job.config.model.task, assets.model_dir)),
        batch_size=job.config.batch_size,
        steps_per_round=steps_per_round,
        executor_rounds=executor_rounds(record),
        bare_rounds=[before.rates, after.rates],
        stand_in_cpu_ms_per_step=1e3 * stand_in_cpu_s,
        mixed_precision=mixed_precision,
        device=str(training_device()),
    )


def run(
    work_base: Path,
    cases: list[tuple[Shape, int, int]],
    rounds: int,
    timeout_s: float,
    mixed_precision: str = "no",
) -> list[InnerLoopResult]:
    """`cases`: (model shape, steps per round, repeats). At least 2 rounds: the first is
    warm-up. Each repeat is a whole measurement, bare loops included; the one with the
    median ratio is reported, since the machine's speed drifts by more than the gap sought.
    `mixed_precision`: "no" or "bf16", for the executor and the bare loop alike."""
    if rounds < 2:
        raise BenchError("the inner-loop benchmark needs at least 2 rounds (the first is warm-up)")
    results = []
    # The executor's and the coordinator's lines would break up the results table.
    with contextlib.redirect_stdout(sys.stderr):
        for shape, steps, repeats in cases:
            repeated = [
                measure(shape, steps, rounds, work_base, timeout_s, mixed_precision)
                for _ in range(repeats)
            ]
            repeated.sort(key=lambda result: result.ratio)
            median = repeated[len(repeated) // 2]
            results.append(replace(median, repeat_ratios=[r.ratio for r in repeated]))
    return results
