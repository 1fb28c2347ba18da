"""Benchmark 3: what one DiLoCo sync round costs a worker, against one `save_file`.

The worker's side of a round is the executor's own `Synchroniser.run`, the very call
`Trainer.synchronise` makes, over its Alpha17Bridge, a real bridge server on a Unix socket
and the local cluster's coordinator as scheduler and parameter server. Timed, as the
executor times it: gather, write the pseudo-gradient, send it, report `update`; then
merge the update, load it into the model, report `update-received`. Not timed: waiting
for the parameter server. The baseline is one
`safetensors.torch.save_file` of the same tensors, in the same work dir, in the same round.
Each model runs with fp32 pseudo-gradients (the default) and, where asked, bf16 ones
(`--pseudo-gradient-dtype bfloat16`), against the same fp32 baseline.

The bridge and the coordinator run in a process of their own, as the worker does (the
bridge calls the coordinator directly, as the inner-loop benchmark's does): in
this one, their copies of every file (hundreds of MB per round at 100M parameters)
would churn the memory the worker side allocates from and slow it down unfairly.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from bench.errors import BenchError
from bench.models import Shape, parameter_count
from hypha.accelerate_executor.protocol.alpha17.job import Job, parse_job
from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    ScheduleUpdate,
    batch_status,
    expect,
)
from hypha.accelerate_executor.training.alpha17.bridge import Alpha17Bridge
from hypha.accelerate_executor.training.alpha17.synchroniser import PARTS as SYNC_PARTS
from hypha.accelerate_executor.training.alpha17.synchroniser import Synchroniser
from hypha.accelerate_executor.training.distributed import ModelWeights, Ranks, canonical_names
from hypha.standin.alpha17.bridge_http import Alpha17BridgeServer as BridgeServer
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.worker.bridge_server import SOCKET_NAME

# The executor's parts of a round (sync.PARTS), less the wait for the parameter server.
PARTS = tuple(part for part in SYNC_PARTS if part != "wait")
# Its imports (torch) and the assets it may have to generate, on a slow machine.
HYPHA_SIDE_START_S = 300.0


@dataclass
class SyncResult:
    model: str
    dtype: str
    parameters: int
    bytes_out: int
    rounds: int
    save_file_s: float
    sync_s: float
    waiting_s: float  # for information: the parameter server's share, left out of sync_s
    round_trip_s: float  # for information: one `status` request through the bridge
    parts_s: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.sync_s / self.save_file_s


class WorkerSide:
    """One job's worker end: a model, and the executor's own Synchroniser over a bridge."""

    def __init__(
        self, accelerator: Accelerator, shape: Shape, job: Job, bridge: Alpha17Bridge, dtype: str
    ) -> None:
        self.bridge = bridge
        self.model = accelerator.prepare(shape.build())
        self.weights = ModelWeights(accelerator, self.model, canonical_names(self.model))
        config = job.config
        self.synchroniser = Synchroniser(
            self.weights, Ranks(accelerator), bridge.work_dir, bridge, config.updates,
            config.results, getattr(torch, dtype),
        )  # fmt: skip

    @torch.no_grad()
    def train_stand_in(self) -> float:
        """Moves every weight, so that the pseudo-gradient is not all zeros, and reports the
        batch; returns how long that report's round trip through the bridge took."""
        for parameter in self.model.parameters():
            parameter.add_(1e-3)
        # The scheduler answers Continue while its projection of the round's end is over 10 s
        # away (a slow start on a busy machine): report batches until it schedules the update.
        for _ in range(100):
            started = time.perf_counter()
            answer = self.bridge.status(batch_status(1))
            round_trip = time.perf_counter() - started
            expect(answer, Continue, ScheduleUpdate, sent="status")
            if isinstance(answer, ScheduleUpdate):
                return round_trip
        raise BenchError("the scheduler never answered ScheduleUpdate in 100 batches")

    def save_file_once(self, path: Path) -> float:
        tensors = self.weights.local()
        started = time.perf_counter()
        save_file(tensors, path)
        seconds = time.perf_counter() - started
        path.unlink()
        return seconds


def serve_hypha_side(work_dir: str, rounds: int, connection: Connection) -> None:
    """In a child process: the coordinator and the job's bridge, until the parent says stop.
    Sends ("job", JOB_JSON) once both serve, or ("error", message)."""
    sys.stdout = sys.stderr  # its lines would break up the results table
    try:
        # One worker, one batch per round, ScheduleUpdate{0} at once: nothing but the sync.
        options = RunOptions(workers=1, rounds=rounds, steps_per_round=1, generation="alpha17")
        catalog = Catalog.from_assets(ensure_assets())  # it must have data; none is fetched
        with build_coordinator(catalog, options, name="bench-coordinator") as coordinator:
            job = coordinator.assign_job("bench-worker")
            backend = coordinator.backend(job["job_id"])  # as in the inner-loop bench
            with BridgeServer(Path(work_dir), backend, name="bench-bridge"):
                connection.send(("job", json.dumps(job)))
                with contextlib.suppress(EOFError):  # EOF: the parent is gone, stop too
                    connection.recv()
    except Exception as exc:
        connection.send(("error", f"{type(exc).__name__}: {exc}"))


@contextlib.contextmanager
def hypha_side(work_dir: Path, rounds: int) -> Iterator[Job]:
    """A coordinator and a bridge on work_dir/bridge.sock in a child process; the job."""
    context = multiprocessing.get_context("spawn")  # no fork of a process running torch
    ours, theirs = context.Pipe()
    process = context.Process(
        target=serve_hypha_side, args=(str(work_dir), rounds, theirs), daemon=True
    )
    process.start()
    theirs.close()
    try:
        if not ours.poll(HYPHA_SIDE_START_S):
            raise BenchError(
                f"the bridge and coordinator process did not start in {HYPHA_SIDE_START_S:.0f} s"
            )
        try:
            kind, payload = ours.recv()
        except EOFError:
            raise BenchError(
                f"the bridge and coordinator process exited with {process.exitcode}"
            ) from None
        if kind != "job":
            raise BenchError(f"the bridge and coordinator process failed: {payload}")
        yield parse_job(payload)
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        process.join(30.0)
        if process.is_alive():
            process.terminate()
            process.join()


def measure(
    accelerator: Accelerator, shape: Shape, dtype: str, work_dir: Path, rounds: int
) -> SyncResult:
    """`rounds` timed rounds after one warm-up round; medians of each."""
    with hypha_side(work_dir, rounds + 1) as job:
        bridge = Alpha17Bridge(work_dir / SOCKET_NAME, work_dir)
        worker = WorkerSide(accelerator, shape, job, bridge, dtype)
        parts: dict[str, list[float]] = {part: [] for part in PARTS}
        saves, waits, round_trips, size = [], [], [], 0
        baseline = work_dir / "baseline.safetensors"
        for round_number in range(1, rounds + 2):
            round_trip = worker.train_stand_in()
            # Alternating which goes first: neither always meets the other's dirty pages.
            if round_number % 2:
                save_s = worker.save_file_once(baseline)
            outcome = worker.synchroniser.run(round_number)
            if not round_number % 2:
                save_s = worker.save_file_once(baseline)
            if round_number == 1:
                continue  # warm-up: first allocations, first files
            saves.append(save_s)
            waits.append(outcome.seconds["wait"])
            round_trips.append(round_trip)
            size = outcome.bytes_out
            for part in PARTS:
                parts[part].append(outcome.seconds[part])
    sums = [sum(values) for values in zip(*parts.values(), strict=True)]
    return SyncResult(
        model=shape.name,
        dtype=dtype,
        parameters=parameter_count(worker.model),
        bytes_out=size,
        rounds=rounds,
        save_file_s=statistics.median(saves),
        sync_s=statistics.median(sums),
        waiting_s=statistics.median(waits),
        round_trip_s=statistics.median(round_trips),
        parts_s={part: statistics.median(values) for part, values in parts.items()},
    )


def run(
    work_root: Path, shapes: list[Shape], rounds: int, dtypes: tuple[str, ...] = ("float32",)
) -> list[SyncResult]:
    accelerator = Accelerator(cpu=True)
    results = []
    for shape in shapes:
        for dtype in dtypes:
            work_dir = work_root / f"sync-{shape.name}-{dtype}"
            work_dir.mkdir(parents=True)
            results.append(measure(accelerator, shape, dtype, work_dir, rounds))
    return results
