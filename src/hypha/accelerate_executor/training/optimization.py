"""The job's optimizer and LR schedule, as torch and transformers build them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hypha.accelerate_executor.protocol.generation import AnyJob
from hypha.accelerate_executor.protocol.job import LrScheduler

# Devices for which every torch this project ships (>= 2.8) has a fused AdamW kernel; a ROCm
# GPU is a "cuda" device to torch.
FUSED_ADAMW_DEVICES = ("cpu", "cuda", "mps")


def adamw_arguments(job: AnyJob) -> dict[str, Any]:
    """The job's optimizer as AdamW arguments; null fields keep torch's defaults."""
    spec = job.config.optimizer
    arguments: dict[str, Any] = {"lr": float(spec.learning_rate)}
    if spec.betas is not None:
        arguments["betas"] = (float(spec.betas[0]), float(spec.betas[1]))
    if spec.epsilon is not None:
        arguments["eps"] = float(spec.epsilon)
    return arguments


def build_adamw(
    parameters: Iterable[torch.Tensor],
    arguments: dict[str, Any],
    device: torch.device,
    sharded: bool = False,
) -> torch.optim.AdamW:
    """AdamW with `arguments` for parameters that will train on `device`, on torch's fused
    kernel where it has one. The update is the same; the fused kernel does it for every tensor
    at once, where torch's default runs a dozen operations per tensor on the CPU and a dozen
    multi-tensor kernels on a GPU: host time a small model's step pays on every step
    (bench/step_overhead.py measures it). Not when `sharded` (FSDP, DeepSpeed): they put
    parameters of their own under the optimizer, and no GPU has run the fused kernel on those
    here."""
    parameters = list(parameters)
    fused = (
        not sharded
        and device.type in FUSED_ADAMW_DEVICES
        and all(p.is_floating_point() for p in parameters)
    )
    # None, not False: False would also turn off the multi-tensor path torch picks on GPUs.
    return torch.optim.AdamW(parameters, **arguments, fused=True if fused else None)


def build_lr_schedule(optimizer: torch.optim.Optimizer, spec: LrScheduler | None) -> Any:
    from transformers import (
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
        get_wsd_schedule,
    )

    if spec is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if spec.type == "cosine-with-warmup":
        return get_cosine_schedule_with_warmup(optimizer, spec.warmup_steps, spec.training_steps)
    if spec.type == "linear-with-warmup":
        return get_linear_schedule_with_warmup(optimizer, spec.warmup_steps, spec.training_steps)
    # The wire's wsd names no total length: warm up, then decay right away over
    # decay_steps, and hold the floor (10% of the peak) after that.
    return get_wsd_schedule(
        optimizer, spec.warmup_steps, spec.decay_steps, num_stable_steps=0, min_lr_ratio=0.1
    )
