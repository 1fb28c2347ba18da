"""Data slices (safetensors files from the bridge) to batches.

A batch is a set of views cut from the slice's tensors along the sample dimension: no
per-sample Python work on the hot path. Rank 0 fetches; every rank reads the file and takes
its own interleaved batches, so all ranks run out of a slice at the same step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from hypha.accelerate_executor.bridge import BridgeClient
from hypha.accelerate_executor.distributed import Ranks
from hypha.accelerate_executor.errors import ExecutorError
from hypha.accelerate_executor.job import DataReference, TrainConfig

Batch = dict[str, torch.Tensor]


class DataError(ExecutorError):
    """A data slice does not hold what the job says it holds."""


def load_slice(path: Path, names: list[str] | None) -> Batch:
    """The named tensors of a slice file (all of them for names=None)."""
    tensors = load_file(path)
    names = sorted(tensors) if names is None else names
    missing = [name for name in names if name not in tensors]
    if missing:
        raise DataError(
            f"data slice {path.name} lacks tensor(s) {', '.join(missing)}; "
            f"it holds {', '.join(sorted(tensors)) or 'nothing'}"
        )
    chosen = {name: tensors[name] for name in names}
    sizes = {tensor.shape[0] if tensor.dim() else 0 for tensor in chosen.values()}
    if len(sizes) != 1:
        raise DataError(f"data slice {path.name}: tensors disagree on the number of samples")
    return chosen


def batches_of(tensors: Batch, batch_size: int, rank: int, world: int) -> Iterator[Batch]:
    """Rank `rank`'s full batches of one slice; the remainder that fills no batch is dropped."""
    samples = next(iter(tensors.values())).shape[0]
    usable = samples // (batch_size * world) * batch_size * world
    # torch.split cuts every view in one call; the ranks take turns batch by batch.
    parts = {
        name: tensor[:usable].split(batch_size)[rank::world] for name, tensor in tensors.items()
    }
    for views in zip(*parts.values(), strict=True):
        yield dict(zip(parts, views, strict=True))


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
