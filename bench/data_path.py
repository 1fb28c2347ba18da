"""Benchmark 2: one data slice to batches, the executor's way against the naive way.

The executor's way is `load_slice` + `worker_batches`: the file read into one buffer (mapped,
when large), batches cut from it as views along the sample dimension. The naive way is the
one a PyTorch user writes: safetensors' own `load_file`, a map-style Dataset indexed sample
by sample, and `torch.utils.data.default_collate` for each batch, which is what
`DataLoader(dataset, batch_size, drop_last=True)` does per batch; its sampler and iterator
are left out, so they add nothing to the baseline. (This baseline used to be a hand-written
per-sample `torch.stack`; `default_collate` is the standard way to collate, and measured
within a few percent of it.) Both start from the same file, warm in the page cache, and must
yield the same batches. A large slice is mapped by both ways (`load_file` maps too): the
naive way's collation reads every sample, the executor's views are read when training
first touches them, which is not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset, default_collate

from bench.errors import BenchError
from bench.timing import interleaved_medians
from hypha.accelerate_executor.training.data import Batch, Share, load_slice, worker_batches

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
    slices = iter([load_slice(path, NAMES)])
    return list(worker_batches(slices, batch_size, Share(0, batch_size)))


class SliceDataset(Dataset[Batch]):
    """A map-style Dataset over a slice's tensors: one sample per index."""

    def __init__(self, tensors: Batch) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> Batch:
        return {name: tensor[index] for name, tensor in self.tensors.items()}


def naive_batches(path: Path, batch_size: int) -> list[Batch]:
    tensors = load_file(path)
    dataset = SliceDataset({name: tensors[name] for name in NAMES})
    return [
        default_collate([dataset[index] for index in range(start, start + batch_size)])
        for start in range(0, len(dataset) - batch_size + 1, batch_size)
    ]


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
