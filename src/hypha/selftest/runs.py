"""What `selftest` runs and measures: the executor on a job from the local stand-in, a bare
training loop of the same model and batch, the out-of-memory micro-batching on the device's
own allocator, and the all-reduce between devices."""

from __future__ import annotations

import gc
import json
import math
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.protocol.generation import AnyJob
from hypha.selftest.workload import ModelSize
from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.data_service.assets import Assets
from hypha.standin.data_service.service import Catalog
from hypha.standin.generations import build_core
from hypha.standin.jobs import Generation, RunOptions
from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry
from hypha.standin.worker.worker import LocalWorker

if TYPE_CHECKING:
    import torch

WORKER = "selftest"
LAUNCHER = "hypha.accelerate_executor.platform.launcher"


@dataclass
class ExecutorRun:
    """The executor's job, as the stand-in recorded it: per round (1..) its metrics."""

    exit_code: int
    rounds: dict[int, dict[str, float]]
    seconds: float
    timed_out: bool = False

    def timed(self, metric: str) -> list[float]:
        """`metric` in every round but the first, which is warm-up (compilation, caches).
        Rounds count from 1 in alpha.17's metrics and from 0 in the action protocol's."""
        return [m[metric] for _, m in sorted(self.rounds.items())[1:] if metric in m]

    @property
    def samples_per_s(self) -> float | None:
        rates = self.timed("samples_per_second")
        return statistics.median(rates) if rates else None

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for _, m in sorted(self.rounds.items()) if "loss" in m]

    def first_round_extra_s(self, batch_size: int) -> float | None:
        """How much longer the first round's training took than a later round's (the
        median), from each round's batches and samples/s: compiling, where the step is
        compiled, and the first kernels' warm-up."""
        seconds = [
            m["batches"] * batch_size / m["samples_per_second"]
            for _, m in sorted(self.rounds.items())
            if m.get("batches") and m.get("samples_per_second")
        ]
        return seconds[0] - statistics.median(seconds[1:]) if len(seconds) > 1 else None

    @property
    def peak_memory_bytes(self) -> float | None:
        peaks = [
            m["peak_device_memory_bytes"]
            for m in self.rounds.values()
            if "peak_device_memory_bytes" in m
        ]
        return max(peaks) if peaks else None


def job_options(size: ModelSize, rounds: int, generation: Generation) -> RunOptions:
    return RunOptions(
        generation=generation,
        workers=1,
        rounds=rounds,
        steps_per_round=size.steps_per_round,
        batch_size=size.batch_size,
        learning_rate=size.learning_rate,
        warmup_steps=min(10, size.steps_per_round),
    )


def start_job(assets: Assets, options: RunOptions) -> tuple[CoordinatorCore, dict[str, Any]]:
    """The stand-in's scheduler, data node and parameter server, and the job it assigns."""
    core = build_core(Catalog.from_assets(assets), options, name=WORKER)
    return core, core.assign_job(WORKER)


class LateAnswers:
    """A bridge backend whose answers to statuses (both generations') come `delay_s` late,
    as a remote scheduler's would: the stand-in's come at once."""

    def __init__(self, backend: Any, delay_s: float) -> None:
        self._backend = backend
        self._delay_s = delay_s

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self._delay_s)
        answer: dict[str, Any] = self._backend.action(request)
        return answer

    def status(self, progress: Any) -> dict[str, Any]:
        time.sleep(self._delay_s)
        answer: dict[str, Any] = self._backend.status(progress)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def run_executor(
    core: CoordinatorCore,
    spec: dict[str, Any],
    config_path: Path,
    processes: int,
    work_base: Path,
    timeout_s: float,
    speculative_step: str = "auto",
    answer_delay_s: float = 0.0,
    compile: str = "auto",
) -> ExecutorRun:
    """Runs the job through the path a Hypha worker takes: the launcher (config, ranks), the
    training ranks, the bridge client, and across a real Unix socket the stand-in's bridge,
    scheduler, data node and parameter server (in this process), whose every answer to a
    status comes `answer_delay_s` late."""
    launch = ("--accelerate-config", str(config_path), "--num-processes", str(processes))
    entry = ExecutorEntry(sys.executable, ("-m", LAUNCHER, *launch, *EXECUTOR_ARGS))
    env = {"HYPHA_SPECULATIVE_STEP": speculative_step, "HYPHA_COMPILE": compile}
    worker = LocalWorker(WORKER, entry, work_base, env=env)
    ended: list[int] = []

    def serve() -> None:
        backend = LateAnswers(core.backend(spec["job_id"]), answer_delay_s)
        result = worker.run(json.dumps(spec), backend)
        ended.append(result.exit_code)
        core.report_exit(spec["job_id"], result.exit_code, result.leaks, result.status)

    started = time.monotonic()
    thread = threading.Thread(target=serve, name="selftest-worker", daemon=True)
    thread.start()
    thread.join(timeout_s)
    timed_out = thread.is_alive()
    if timed_out:
        worker.cancel()  # SIGTERM, SIGKILL 5 s later
        thread.join(30)
    seconds = time.monotonic() - started
    record = core.summary()["workers"][WORKER]
    rounds = {int(r): dict(m) for r, m in record["metrics"].items()}
    return ExecutorRun(ended[0] if ended else -1, rounds, seconds, timed_out)


@dataclass
class BareRun:
    """A plain loop's samples/s in each timed round, and its device's peak memory."""

    rates: list[float]
    losses: list[float]
    peak_memory_bytes: int | None

    @property
    def samples_per_s(self) -> float:
        return statistics.median(self.rates)


def training_device() -> torch.device:
    """The device accelerate picks for one process: the first GPU, else MPS, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def bare_loop(
    job: AnyJob, assets: Assets, steps_per_round: int, rounds: int, mixed_precision: str
) -> BareRun:
    """The job's training as a plain PyTorch loop: the same model files, batch, AdamW (the
    executor's build of it) and LR schedule, its data already on the device, no bridge, no
    accelerate; bf16 under the autocast accelerate uses. Rounds 2.. are timed."""
    import torch
    from safetensors.torch import load_file

    from hypha.accelerate_executor.training.modeling import load_model
    from hypha.accelerate_executor.training.optimization import (
        adamw_arguments,
        build_adamw,
        build_lr_schedule,
    )

    device = training_device()
    model = load_model(job.config.model.task, assets.model_dir).to(device)
    model.train()
    optimizer = build_adamw(model.parameters(), adamw_arguments(job), device)
    schedule = build_lr_schedule(optimizer, job.config.scheduler)
    slices = [load_file(path) for path in sorted(assets.dataset_dir.glob("*.safetensors"))]
    tokens = {
        name: torch.cat([part[name] for part in slices]).to(device)
        for name in ("input_ids", "labels")
    }
    batch_size = job.config.batch_size
    batches = tokens["input_ids"].shape[0] // batch_size
    if batches == 0:
        raise ValueError(f"the data set holds fewer samples than one batch of {batch_size}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step, rates, losses = 0, [], []
    for round_number in range(1, rounds + 1):
        started = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        for _ in range(steps_per_round):
            start = (step % batches) * batch_size
            batch = {name: t[start : start + batch_size] for name, t in tokens.items()}
            with torch.autocast(device.type, torch.bfloat16, enabled=mixed_precision == "bf16"):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
            step += 1
        # The round's work is done only once its loss is read, as in the executor.
        losses.append(float(loss_sum.item()) / steps_per_round)
        if round_number > 1:
            rates.append(steps_per_round * batch_size / (time.perf_counter() - started))
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    del model, optimizer, schedule, tokens
    release_device_memory()
    return BareRun(rates, losses, peak)


def release_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class OomCheck:
    """A batch that does not fit under a memory cap, stepped by the executor's
    MicroBatchedStep: it must halve the micro-batch until it fits, and train."""

    batch_size: int
    cap_bytes: int
    micro_batch_size: int  # what it settled on
    messages: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def halved(self) -> bool:
        return self.micro_batch_size < self.batch_size

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and self.halved
            and bool(self.losses)
            and all(math.isfinite(x) for x in self.losses)
        )


def oom_check(job: AnyJob, assets: Assets, mixed_precision: str, times: int = 4) -> OomCheck:
    """Measures the memory one step of the job's batch takes, caps this process's GPU memory
    at half as much again, and steps a batch `times` as large: it cannot fit in one piece,
    nor in half when `times` is 4, and must train in micro-batches."""
    import torch
    from accelerate import Accelerator
    from safetensors.torch import load_file

    from hypha.accelerate_executor.errors import OutOfMemory
    from hypha.accelerate_executor.training.distributed import Ranks
    from hypha.accelerate_executor.training.modeling import load_model
    from hypha.accelerate_executor.training.optimization import adamw_arguments, build_adamw
    from hypha.accelerate_executor.training.steps import MicroBatchedStep

    accelerator = Accelerator(mixed_precision=mixed_precision)
    # torch's per-process memory cap wants the device's index, which accelerate leaves out.
    device = torch.device("cuda", torch.cuda.current_device())
    model = load_model(job.config.model.task, assets.model_dir)
    optimizer = build_adamw(model.parameters(), adamw_arguments(job), device)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    ranks = Ranks(accelerator)
    names = job.config.model.input_names
    size = job.config.batch_size
    first = load_file(next(iter(sorted(assets.dataset_dir.glob("*.safetensors")))))
    batch = {name: first[name][:size].to(device) for name in ("input_ids", "labels")}
    one_piece = MicroBatchedStep(accelerator, model, optimizer, ranks, size, names)
    one_piece(batch)  # the optimizer's state exists from here on
    torch.cuda.synchronize(device)
    release_device_memory()
    base = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    one_piece(batch)
    torch.cuda.synchronize(device)
    cap = int(base + 1.5 * (torch.cuda.max_memory_reserved(device) - base))
    release_device_memory()
    big = {name: torch.cat([tensor] * times) for name, tensor in batch.items()}
    check = OomCheck(size * times, cap, size * times)
    step = MicroBatchedStep(
        accelerator, model, optimizer, ranks, size * times, names, None, check.messages.append
    )
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        for _ in range(2):
            check.losses.append(float(step(big)))
    except OutOfMemory as exc:
        check.error = str(exc)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        check.micro_batch_size = step.micro_batch_size
        del model, optimizer, one_piece, step, big, batch
        release_device_memory()
    return check


def allreduce_bus_bandwidth(
    world: int, device_type: str, size_bytes: int = 256 << 20, iterations: int = 10
) -> float:
    """Bus bandwidth (bytes/s) of an all-reduce of `size_bytes` over `world` processes, one
    per device (NCCL on GPUs, gloo on the CPU), as nccl-tests counts it: the bytes each
    device sends and receives, algorithm bandwidth x 2(n-1)/n."""
    from hypha.accelerate_executor.platform.launcher.plan import free_port

    context = multiprocessing.get_context("spawn")
    results = context.SimpleQueue()
    port = free_port()
    processes = [
        context.Process(
            target=_allreduce_rank,
            args=(rank, world, port, device_type, size_bytes, iterations, results),
            daemon=True,
        )
        for rank in range(world)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(300)
    if any(process.exitcode != 0 for process in processes) or results.empty():
        codes = ", ".join(str(process.exitcode) for process in processes)
        raise RuntimeError(f"the all-reduce processes failed (exit codes {codes})")
    seconds: float = results.get()
    return size_bytes / seconds * 2 * (world - 1) / world


def _allreduce_rank(
    rank: int,
    world: int,
    port: int,
    device_type: str,
    size_bytes: int,
    iterations: int,
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    try:
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
        synchronise: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
        for _ in range(3):
            dist.all_reduce(tensor)
        synchronise()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor)
        synchronise()
        if rank == 0:
            results.put((time.perf_counter() - started) / iterations)
    finally:
        dist.destroy_process_group()
