"""A round's figures, built in one place for both generations: what the scheduler is sent
(alpha.17's `metrics`, the action protocol's `sent-update`), and what the operator sees, the
round's log line and its telemetry gauges (hypha.training.NAME, docs/telemetry.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hypha.accelerate_executor import telemetry


def training_metrics(
    *,
    batches: int,
    samples: int,
    seconds: float,
    learning_rate: float,
    loss: float | None,
    tokens: int = 0,
    peak_memory: int | None = None,
) -> dict[str, float]:
    """What a round trained, by the names the scheduler and telemetry read: rates only where
    it trained (a round of no batches has none), the loss only where there is a finite one
    (JSON has no NaN), the device's peak where the device has one."""
    metrics = {"batches": float(batches)}
    if batches:
        metrics["samples_per_second"] = samples / max(seconds, 1e-9)
        metrics["learning_rate"] = learning_rate
        if tokens:
            metrics["tokens_per_second"] = tokens / max(seconds, 1e-9)
    if loss is not None and math.isfinite(loss):
        metrics["loss"] = loss
    if peak_memory is not None:
        metrics["peak_device_memory_bytes"] = float(peak_memory)
    return metrics


def round_ended(
    say: Callable[[str, Mapping[str, float]], None],
    round_number: int,
    figures: Mapping[str, float],
    line: str,
) -> None:
    """The operator told of a round: its figures as telemetry, and one log line carrying
    them, `round N: ...`."""
    numbered = {"round": float(round_number), **figures}
    telemetry.round_ended(numbered)
    say(f"round {round_number}: {line}", numbered)


def loss_text(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.4f}"
