"""Data slices (safetensors files from the bridge) to batches.

A slice file is read with one read into one buffer (mapped instead, when it is large) and
its tensors are views of that buffer; a batch is a set of views cut from those along the
sample dimension, all of a tensor's batches in one call: batches copy nothing, and there is
no per-sample Python work. Rank 0 fetches; every rank reads the file and takes its own
interleaved batches, so all ranks run out of a slice at the same step.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from hypha.accelerate_executor.bridge import BridgeClient
from hypha.accelerate_executor.distributed import Ranks
from hypha.accelerate_executor.errors import ExecutorError
from hypha.accelerate_executor.job import DataReference, TrainConfig
from hypha.accelerate_executor.tensorfile import TensorEntry, read_layout

Batch = dict[str, torch.Tensor]
# A slice up to this size is read whole, a larger one is mapped. Counting the page faults that
# training pays when it first touches a mapping, one read is the cheaper at 1 MiB and not at
# 4 MiB (2-core x86 Linux, read then summed: 64 KiB 7 us vs 16 us mapped; 1 MiB 55 vs 73 us;
# 4 MiB 175 vs 63 us).
READ_WHOLE_BYTES = 1 << 20


class DataError(ExecutorError):
    """A data slice does not hold what the job says it holds."""


def load_slice(path: Path, names: list[str] | None) -> Batch:
    """The named tensors of a slice file (all of them for names=None), views of one buffer.
    A file that is not a safetensors file raises TensorFileError, an ExecutorError."""
    entries, contents = _read_slice(path)
    names = sorted(entries) if names is None else names
    missing = [name for name in names if name not in entries]
    if missing:
        raise DataError(
            f"data slice {path.name} lacks tensor(s) {', '.join(missing)}; "
            f"it holds {', '.join(sorted(entries)) or 'nothing'}"
        )
    scalars = [name for name in names if not entries[name].shape]
    if scalars:
        raise DataError(
            f"data slice {path.name}: tensor(s) {', '.join(scalars)} are scalars, "
            "with no sample dimension"
        )
    if len({entries[name].shape[0] for name in names}) != 1:
        raise DataError(f"data slice {path.name}: tensors disagree on the number of samples")
    return {name: _view(contents, entries[name]) for name in names}


def batches_of(tensors: Batch, batch_size: int, rank: int, world: int) -> Iterator[Batch]:
    """Rank `rank`'s full batches of one slice; the remainder that fills no batch is dropped."""
    samples = next(iter(tensors.values())).shape[0]
    count = samples // (batch_size * world)
    parts = [_rank_batches(tensor, batch_size, rank, world, count) for tensor in tensors.values()]
    names = list(tensors)
    for views in zip(*parts, strict=True):
        yield dict(zip(names, views, strict=True))


def _read_slice(path: Path) -> tuple[dict[str, TensorEntry], bytearray | mmap.mmap]:
    try:
        with open(path, "rb", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            entries = read_layout(file, size)
            if size > READ_WHOLE_BYTES:
                # Copy-on-write, so that a step writing into its batch never changes the file.
                contents: bytearray | mmap.mmap = mmap.mmap(
                    file.fileno(), size, access=mmap.ACCESS_COPY
                )
            else:
                contents = bytearray(size)
                if os.preadv(file.fileno(), [contents], 0) != size:
                    raise DataError(f"data slice {path.name} shrank while it was read")
    except OSError as exc:
        raise DataError(f"data slice {path.name} cannot be read: {exc.strerror}") from None
    return {entry.name: entry for entry in entries}, contents


def _view(contents: bytearray | mmap.mmap, entry: TensorEntry) -> torch.Tensor:
    count = entry.numel
    if count == 0:
        return torch.empty(entry.shape, dtype=entry.dtype)  # frombuffer refuses zero elements
    tensor = torch.frombuffer(contents, dtype=entry.dtype, count=count, offset=entry.offset)
    # The format does not promise aligned offsets, and torch's kernels assume them.
    aligned = tensor.data_ptr() % entry.dtype.itemsize == 0
    return tensor.view(entry.shape) if aligned else tensor.view(entry.shape).clone()


def _rank_batches(
    tensor: torch.Tensor, batch_size: int, rank: int, world: int, count: int
) -> tuple[torch.Tensor, ...]:
    """The rank's `count` batches of one tensor: its batch i holds samples from
    (i * world + rank) * batch_size on. One strided view unbound into batch views, so the
    cost grows with this rank's batches only, in a single call each."""
    step, *rest = tensor.stride()
    return tensor.as_strided(
        (count, batch_size, *tensor.shape[1:]),
        (world * batch_size * step, step, *rest),
        tensor.storage_offset() + rank * batch_size * step,
    ).unbind(0)


class SliceStream:
    """Endless batches: scheduler slices are fetched one ahead in the background;
    uri/huggingface data is fetched once and cycled."""

    def __init__(
        self,
        bridge: BridgeClient | None,
        reference: DataReference,
        names: list[str] | None,
        batch_size: int,
        ranks: Ranks,
    ) -> None:
        self._bridge = bridge
        self._reference = reference
        self._names = names
        self._batch_size = batch_size
        self._ranks = ranks
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hypha-fetch")
        self._next: Future[list[Path]] | None = None
        self._static_files: Iterator[Path] | None = None
        self._previous: Path | None = None

    def __iter__(self) -> Iterator[Batch]:
        while True:
            path = Path(self._ranks.share(self._next_path() if self._ranks.is_main else ""))
            tensors = load_slice(path, self._names)
            self._forget_previous(path)
            yielded = False
            for batch in batches_of(
                tensors, self._batch_size, self._ranks.index, self._ranks.count
            ):
                yielded = True
                yield batch
            if not yielded:
                raise DataError(
                    f"data slice {path.name} holds fewer samples than one batch "
                    f"({self._batch_size} x {self._ranks.count} processes)"
                )

    def close(self) -> None:
        self._fetcher.shutdown(wait=False, cancel_futures=True)

    def _fetch(self) -> list[Path]:
        assert self._bridge is not None
        return [entry.path for entry in self._bridge.fetch(self._reference)]

    def _next_path(self) -> str:
        if self._reference.type != "scheduler":
            if self._static_files is None:
                self._static_files = itertools.cycle(self._fetch())
            return str(next(self._static_files))
        pending = self._next or self._fetcher.submit(self._fetch)
        self._next = self._fetcher.submit(self._fetch)
        files = pending.result()
        if len(files) != 1:
            raise DataError(f"the bridge answered a data fetch with {len(files)} files, expected 1")
        return str(files[0])

    def _forget_previous(self, current: Path) -> None:
        # Scheduler slices are read once: delete the last one so a long job's work dir stays
        # small. Other ranks loaded it a whole slice ago.
        if self._ranks.is_main and self._reference.type == "scheduler":
            if self._previous is not None and self._previous != current:
                self._previous.unlink(missing_ok=True)
            self._previous = current


def preprocessing(config: TrainConfig, processor: Any) -> Callable[[Batch], Batch]:
    """Turns a batch's raw inputs into model inputs with the job's preprocessor; its outputs
    are merged with the slice's other tensors and the model gets its `input-names` (plus an
    attention mask, when the preprocessor makes one).

    Text travels in a slice as UTF-8 bytes, one zero-padded uint8 row per sample; other
    inputs (images, audio, video) go to the processor as tensors.
    """
    assert config.preprocessor is not None
    spec = config.preprocessor
    wanted = {*config.model.input_names, "attention_mask"}

    def apply(batch: Batch) -> Batch:
        raw = [batch[name] for name in spec.input_names]
        if spec.task == "tokenizer":
            texts = [bytes(row.tolist()).rstrip(b"\0").decode("utf-8", "replace") for row in raw[0]]
            encoded = processor(texts, padding=True, truncation=True, return_tensors="pt")
        else:
            encoded = processor(*raw, return_tensors="pt")
        merged = {**batch, **dict(encoded.items())}
        if config.model.task == "causal-lm" and "labels" not in merged and "input_ids" in merged:
            labels = merged["input_ids"].clone()
            if "attention_mask" in merged:
                labels[merged["attention_mask"] == 0] = -100  # padding teaches nothing
            merged["labels"] = labels
        return {name: tensor for name, tensor in merged.items() if name in wanted}

    return apply
