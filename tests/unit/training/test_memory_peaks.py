"""Every rank's memory peaks: read, gathered, named as round metrics both bridge generations
carry, and written into the round's line."""

from __future__ import annotations

import resource
from types import SimpleNamespace
from typing import Any

import pytest

from hypha.accelerate_executor.protocol.actions.messages import sent_update
from hypha.accelerate_executor.protocol.alpha17.messages import round_metrics
from hypha.accelerate_executor.training.distributed import Ranks
from hypha.accelerate_executor.training.round_metrics import (
    MemoryPeaks,
    host_peak_memory,
    memory_metrics,
    memory_text,
    training_metrics,
)

GPU = MemoryPeaks(host=[3_200_000_000, 3_100_000_000], device=[1_230_000_000, 1_100_000_000])
CPU = MemoryPeaks(host=[900_000_000, 1_250_000_000])


def test_a_gpu_job_names_every_ranks_device_and_host_peak_and_the_largest_of_each() -> None:
    assert memory_metrics(GPU) == {
        "peak_device_memory_bytes": 1.23e9,
        "peak_device_memory_bytes_rank_0": 1.23e9,
        "peak_device_memory_bytes_rank_1": 1.1e9,
        "peak_host_memory_bytes": 3.2e9,
        "peak_host_memory_bytes_rank_0": 3.2e9,
        "peak_host_memory_bytes_rank_1": 3.1e9,
    }


def test_a_cpu_job_has_host_peaks_only() -> None:
    assert memory_metrics(CPU) == {
        "peak_host_memory_bytes": 1.25e9,
        "peak_host_memory_bytes_rank_0": 9e8,
        "peak_host_memory_bytes_rank_1": 1.25e9,
    }


def test_the_round_line_says_each_ranks_peak() -> None:
    assert memory_text(GPU) == "peak device 1.23/1.10 GB, host 3.20/3.10 GB per rank"
    assert memory_text(CPU) == "peak host 0.90/1.25 GB per rank"


def test_both_generations_messages_carry_the_peaks() -> None:
    metrics = training_metrics(
        batches=2, samples=16, seconds=1.0, learning_rate=1e-3, loss=2.0, memory=GPU
    )
    assert metrics["peak_device_memory_bytes_rank_1"] == 1.1e9
    alpha17 = round_metrics(1, metrics).model_dump(mode="json")["metrics"]["metrics"]
    actions = sent_update(0, metrics).model_dump(mode="json")["metrics"]
    assert alpha17 == actions == metrics


def test_the_host_peak_is_this_processs_peak_resident_set() -> None:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    # VmHWM and ru_maxrss are the same high-water mark, read at different moments.
    assert host_peak_memory() == pytest.approx(kib * 1024, rel=0.05)
    assert 10e6 < host_peak_memory() < 64e9


def test_a_single_process_gathers_its_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    accelerator: Any = SimpleNamespace(process_index=0, num_processes=1, parallelism_config=None)
    assert Ranks(accelerator).gather([5, 7]) == [[5, 7]]
