"""Benchmark 2: one data slice to batches, the executor's way against the naive way.

The executor's way is `load_slice` + `batches_of` (batches are views cut along the sample
dimension). The naive way is what a map-style Dataset plus the default collate does:
index every sample in Python, then `torch.stack` each batch. Both start from the same
safetensors file on disk, read with the same safetensors loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench.errors import BenchError
from bench.timing import interleaved_medians
from hypha.accelerate_executor.data import Batch, batches_of, load_slice

NAMES = ["input_ids", "labels"]


@dataclass(frozen=True)
class SliceShape:
    samples: int
    seq_len: int

    def __str__(self) -> str:
        return f"{self.samples}x{self.seq_len} slice"


@dataclass
class DataPathResult:
    slice: str
    batch_size: int
    batches: int
    executor_s: float
    naive_s: float

    @property
    def executor_batches_per_s(self) -> float:
        return self.batches / self.executor_s

    @property
    def naive_batches_per_s(self) -> float:
        return self.batches / self.naive_s

    @property
    def speedup(self) -> float:
        return self.naive_s / self.executor_s


def write_slice(path: Path, shape: SliceShape, vocab_size: int = 512) -> None:
    """A slice like the local cluster's: token ids, with labels equal to the inputs."""
    tokens = torch.randint(
        vocab_size, (shape.samples, shape.seq_len), generator=torch.Generator().manual_seed(0)
    )
    save_file({"input_ids": tokens, "labels": tokens.clone()}, str(path))


def executor_batches(path: Path, batch_size: int) -> list[Batch]:
    return list(batches_of(load_slice(path, NAMES), batch_size, rank=0, world=1))


def naive_batches(path: Path, batch_size: int) -> list[Batch]:
    tensors = load_file(path)
    samples = tensors[NAMES[0]].shape[0]
    batches = []
    for start in range(0, samples - batch_size + 1, batch_size):
        items = [
            {name: tensors[name][index] for name in NAMES}
            for index in range(start, start + batch_size)
        ]
        batches.append({name: torch.stack([item[name] for item in items]) for name in NAMES})
    return batches


def run(
    work_dir: Path, shapes: list[SliceShape], batch_size: int, repeats: int
) -> list[DataPathResult]:
    results = []
    for shape in shapes:
        path = work_dir / f"slice-{shape.samples}x{shape.seq_len}"
        write_slice(path, shape)
        fast, slow = executor_batches(path, batch_size), naive_batches(path, batch_size)
        # A faster way that yields other batches would prove nothing.
        if len(fast) != len(slow) or any(
            not torch.equal(a[name], b[name])
            for a, b in zip(fast, slow, strict=True)
            for name in NAMES
        ):
            raise BenchError(f"the two data paths disagree on the batches of the {shape}")
        medians = interleaved_medians(
            {
                "executor": partial(executor_batches, path, batch_size),
                "naive": partial(naive_batches, path, batch_size),
            },
            repeats,
        )
        results.append(
            DataPathResult(str(shape), batch_size, len(fast), medians["executor"], medians["naive"])
        )
    return results
