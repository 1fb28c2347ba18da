"""Benchmark 7: the executor's own host time per step, where a GPU would expose it.

On a GPU a small model's step takes a few milliseconds, and whatever the executor does
around it on the host (accelerate's wrappers, micro-batching, batching, the round's
decision, the status hand-off) becomes a visible share. Measured here with the near-free
model (bench/near_free_code: four weights, a step of well under a millisecond), in this
process, on one torch thread: the CPU time per step of the executor's own per-step work
(MicroBatchedStep on an accelerate-prepared model and optimizer, the LR schedule, the
batch cut by worker_batches and moved to the device, the scheduler decision over the
answers that came, the status written by StatusReporter to a bridge that answers at once,
in another process, and its answer read) against a bare loop of the same model (forward, backward, AdamW,
zero_grad, LR schedule on the same batches). The two run in alternation, in blocks, and
each is summarised by its median block. The difference is the executor's host overhead
per step; as a share of a 5 ms and a 20 ms GPU step it says what the executor would cost
a GPU whose host work does not overlap the device's (the worst case). Both loops step the
AdamW the executor builds (optimization.build_adamw), so that the difference is bookkeeping.

Beside it, that AdamW's own host time: one step over the demo GPT-2's parameters (random
gradients), fused as the executor builds it, against torch's default (on the CPU, a loop of
a dozen operations per tensor; on a GPU it would be a dozen multi-tensor kernels).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.errors import BenchError
from bench.models import DEMO
from bench.near_free_code.configuration_near_free import NearFreeConfig
from bench.near_free_code.modeling_near_free import NearFreeForCausalLM
from hypha.accelerate_executor.training.optimization import build_adamw

CPU = torch.device("cpu")

GPU_STEPS_MS = (5.0, 20.0)
BATCH = 8
SEQUENCE = 64


@dataclass
class StepOverheadResult:
    bare_us: float  # CPU per step of the bare loop (the near-free model's own cost)
    executor_us: float  # CPU per step of the executor's per-step work, same model
    blocks: int
    steps_per_block: int
    adamw_default_us: float  # CPU of one AdamW step over the demo GPT-2, torch's default
    adamw_fused_us: float  # the same, as the executor builds it

    @property
    def overhead_us(self) -> float:
        return self.executor_us - self.bare_us

    def speed_at(self, gpu_step_ms: float) -> float:
        """A GPU step's speed with the overhead added, as a share of its bare speed."""
        return gpu_step_ms / (gpu_step_ms + self.overhead_us / 1e3)


def _slices(samples: int) -> Iterator[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    while True:
        tokens = torch.randint(512, (samples, SEQUENCE), generator=generator)
        yield {"input_ids": tokens, "labels": tokens.clone()}


def _model() -> NearFreeForCausalLM:
    torch.manual_seed(0)
    return NearFreeForCausalLM(NearFreeConfig())


def bare_steps(steps: int) -> Callable[[], None]:
    model = _model()
    optimizer = build_adamw(model.parameters(), {"lr": 1e-3}, CPU)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    slices = _slices(64)
    batches = (
        {name: t[start : start + BATCH] for name, t in part.items()}
        for part in slices
        for start in range(0, 64, BATCH)
    )

    def run() -> None:
        for _ in range(steps):
            model(**next(batches)).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()

    return run


def executor_steps(steps: int, socket_path: Path, work_dir: Path) -> Callable[[], None]:
    from accelerate import Accelerator

    from hypha.accelerate_executor.bridge.client import BridgeClient
    from hypha.accelerate_executor.training.alpha17.loop import TRAIN_ON, scheduler_decision
    from hypha.accelerate_executor.training.alpha17.status_reporter import StatusReporter
    from hypha.accelerate_executor.training.data import Share, worker_batches
    from hypha.accelerate_executor.training.distributed import Ranks
    from hypha.accelerate_executor.training.steps import MicroBatchedStep, plain_optimizer

    accelerator = Accelerator(cpu=True)
    model = _model()
    model, optimizer = accelerator.prepare(
        model, build_adamw(model.parameters(), {"lr": 1e-3}, accelerator.device)
    )
    model.train()
    # As the Trainer builds it: on the torch optimizer, which the step drives directly.
    schedule = torch.optim.lr_scheduler.LambdaLR(plain_optimizer(optimizer), lambda _: 1.0)
    ranks = Ranks(accelerator)
    step = MicroBatchedStep(
        accelerator, model, optimizer, ranks, BATCH, ["input_ids", "labels"], None, print
    )
    batches = worker_batches(_slices(64), BATCH, Share(0, BATCH))
    reporter = StatusReporter(BridgeClient(socket_path, work_dir))
    trained = [0]
    device = accelerator.device

    def run() -> None:
        loss_sum = torch.zeros((), device=device)
        decision = TRAIN_ON
        for _ in range(steps):
            batch = {k: t.to(device, non_blocking=True) for k, t in next(batches).items()}
            ranks.share(scheduler_decision(reporter.answers(), decision))
            loss_sum += step(batch)
            schedule.step()
            trained[0] += 1
            reporter.batch_done(trained[0], BATCH)
        reporter.flush()
        loss_sum.item()

    return run


def adamw_steps(fused: bool, steps: int) -> Callable[[], None]:
    """`steps` AdamW steps over the demo GPT-2's parameters, with gradients in place."""
    parameters = list(DEMO.build().parameters())
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter)
    optimizer = (
        build_adamw(parameters, {"lr": 1e-3}, CPU)
        if fused
        else torch.optim.AdamW(parameters, lr=1e-3)
    )

    def run() -> None:
        for _ in range(steps):
            optimizer.step()

    return run


def _alternating(
    actions: dict[str, Callable[[], None]], blocks: int, steps_per_block: int
) -> dict[str, float]:
    """Each action's median CPU seconds a step over `blocks` blocks, the actions taking turns
    (after a block of warm-up each)."""
    cpu: dict[str, list[float]] = {name: [] for name in actions}
    for block in range(blocks + 1):
        for name, action in actions.items():
            started = time.process_time()
            action()
            if block:
                cpu[name].append((time.process_time() - started) / steps_per_block)
    return {name: statistics.median(seconds) for name, seconds in cpu.items()}


def run(blocks: int = 15, steps_per_block: int = 100) -> StepOverheadResult:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hypha-step-") as scratch:
        socket_path = Path(scratch) / "bridge.sock"
        # In a process of its own: its CPU is the bridge's, not the executor's.
        server = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("answering_bridge.py")), socket_path]
        )
        deadline = time.monotonic() + 120
        while not socket_path.exists():
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise BenchError("the step-overhead benchmark's bridge did not start")
            time.sleep(0.05)
        try:
            steps = _alternating(
                {
                    "bare": bare_steps(steps_per_block),
                    "executor": executor_steps(steps_per_block, socket_path, Path(scratch)),
                },
                blocks,
                steps_per_block,
            )
        finally:
            server.terminate()
            server.wait()
    adamw_steps_per_block = max(1, steps_per_block // 10)  # each a millisecond or two
    adamw = _alternating(
        {
            "default": adamw_steps(False, adamw_steps_per_block),
            "fused": adamw_steps(True, adamw_steps_per_block),
        },
        blocks,
        adamw_steps_per_block,
    )
    return StepOverheadResult(
        1e6 * steps["bare"],
        1e6 * steps["executor"],
        blocks,
        steps_per_block,
        1e6 * adamw["default"],
        1e6 * adamw["fused"],
    )
