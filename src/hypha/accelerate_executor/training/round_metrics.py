"""A round's figures, built in one place for both generations: what the scheduler is sent
(alpha.17's `metrics`, the action protocol's `sent-update`), and what the operator sees, the
round's log line and its telemetry gauges (hypha.training.NAME, docs/telemetry.md).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hypha.accelerate_executor import telemetry


def training_metrics(
    *,
    batches: int,
    samples: int,
    seconds: float,
    learning_rate: float,
    loss: float | None,
    tokens: int = 0,
    memory: MemoryPeaks | None = None,
) -> dict[str, float]:
    """What a round trained, by the names the scheduler and telemetry read: rates only where
    it trained (a round of no batches has none), the loss only where there is a finite one
    (JSON has no NaN), and every rank's memory peaks (memory_metrics)."""
    metrics = {"batches": float(batches)}
    if batches:
        metrics["samples_per_second"] = samples / max(seconds, 1e-9)
        metrics["learning_rate"] = learning_rate
        if tokens:
            metrics["tokens_per_second"] = tokens / max(seconds, 1e-9)
    if loss is not None and math.isfinite(loss):
        metrics["loss"] = loss
    if memory is not None:
        metrics.update(memory_metrics(memory))
    return metrics


@dataclass(frozen=True)
class MemoryPeaks:
    """The most memory each rank has held since the job began, in rank order: its process's
    resident set (host), and torch's allocator on its GPU (device; None off a GPU)."""

    host: Sequence[int]
    device: Sequence[int] | None = None


def memory_metrics(peaks: MemoryPeaks) -> dict[str, float]:
    """`peak_host_memory_bytes_rank_N` for every rank and `peak_host_memory_bytes`, the largest
    of them; on a GPU the same for `peak_device_memory_bytes` (the name rank 0's device peak
    went by before every rank's was reported, and what selftest reads). An operator sizes a
    host by its largest rank, and sees a rank that holds more than the others."""
    metrics: dict[str, float] = {}
    for kind, values in (("device", peaks.device), ("host", peaks.host)):
        if values:
            metrics[f"peak_{kind}_memory_bytes"] = float(max(values))
            for rank, value in enumerate(values):
                metrics[f"peak_{kind}_memory_bytes_rank_{rank}"] = float(value)
    return metrics


def memory_text(peaks: MemoryPeaks) -> str:
    """The round line's part: `peak device 1.23/1.10 GB, host 3.20/3.10 GB per rank`, the
    device only where there is one."""

    def per_rank(values: Sequence[int]) -> str:
        return "/".join(f"{value / 1e9:.2f}" for value in values) + " GB"

    host = f"host {per_rank(peaks.host)}"
    if peaks.device:
        return f"peak device {per_rank(peaks.device)}, {host} per rank"
    return f"peak {host} per rank"


def host_peak_memory() -> int:
    """This process's peak resident set in bytes: VmHWM where /proc has it (Linux), else
    getrusage's ru_maxrss (bytes on macOS, KiB elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # "VmHWM:  123456 kB"
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


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
