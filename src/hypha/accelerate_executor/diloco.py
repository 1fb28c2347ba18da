"""DiLoCo's outer state on a worker: the global weights a round starts from.

theta_global lives in host memory in fp32 for the whole job (pinned when a GPU is
present, for fast copies), never re-read from disk. At a sync point the worker sends
theta_local - theta_global; when the parameter server's update u arrives, theta_global
becomes theta_global + u and is loaded into the model.

Both files are model-sized, so they stream through a chunk-sized buffer: the subtraction
is written out while it is still in cache, the update is added in as it is read, and no
model-sized temporary is ever allocated (first-touch page faults on one cost more than the
arithmetic).
"""

from __future__ import annotations

import os
from io import FileIO
from pathlib import Path

import torch

from hypha.accelerate_executor.errors import UpdateError
from hypha.accelerate_executor.tensorfile import layout, read_layout

# Elements per streamed chunk: 4 MiB of fp32, which stays in a core's cache.
CHUNK = 1 << 20


class GlobalWeights:
    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        pin = torch.cuda.is_available()
        self.tensors = {
            name: tensor.detach().to("cpu", torch.float32, copy=True)
            for name, tensor in weights.items()
        }
        if pin:
            self.tensors = {name: tensor.pin_memory() for name, tensor in self.tensors.items()}
        self._chunks: dict[torch.dtype, torch.Tensor] = {}

    def write_pseudo_gradient(
        self, local: dict[str, torch.Tensor], path: Path, dtype: torch.dtype = torch.float32
    ) -> int:
        """Writes theta_local - theta_global for every tensor to `path`; returns its size."""
        header, entries = layout([(name, dtype, tuple(self.tensors[name].shape)) for name in local])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb", buffering=0) as file:
            file.write(header)
            for entry in entries:
                theta_local = local[entry.name].detach().to("cpu", torch.float32).reshape(-1)
                theta_global = self.tensors[entry.name].view(-1)
                for start in range(0, entry.numel, CHUNK):
                    stop = min(start + CHUNK, entry.numel)
                    delta = torch.sub(
                        theta_local[start:stop],
                        theta_global[start:stop],
                        out=self._chunk(torch.float32, stop - start),
                    )
                    if dtype != torch.float32:
                        delta = self._chunk(dtype, stop - start).copy_(delta)
                    _write_all(file, delta)
        return len(header) + sum(entry.nbytes for entry in entries)

    def merge_update(self, path: Path) -> int:
        """theta_global += u for every tensor the update holds; returns how many it held."""
        with open(path, "rb", buffering=0) as file:
            entries = read_layout(file, os.fstat(file.fileno()).st_size)
            unknown = sorted(entry.name for entry in entries if entry.name not in self.tensors)
            if unknown:
                raise UpdateError(
                    f"update {path.name} holds tensors the model lacks: {', '.join(unknown[:3])}"
                )
            for entry in entries:
                if entry.shape != self.tensors[entry.name].shape:
                    raise UpdateError(
                        f"update {path.name}: {entry.name} has shape {entry.shape}, "
                        f"the model {tuple(self.tensors[entry.name].shape)}"
                    )
            for entry in sorted(entries, key=lambda entry: entry.offset):
                theta_global = self.tensors[entry.name].view(-1)
                file.seek(entry.offset)
                for start in range(0, entry.numel, CHUNK):
                    stop = min(start + CHUNK, entry.numel)
                    update = self._chunk(entry.dtype, stop - start)
                    _read_exactly(file, update, path)
                    theta_global[start:stop] += update
        return len(entries)

    def _chunk(self, dtype: torch.dtype, elements: int) -> torch.Tensor:
        if dtype not in self._chunks:
            self._chunks[dtype] = torch.empty(CHUNK, dtype=dtype)
        return self._chunks[dtype][:elements]


def _write_all(file: FileIO, tensor: torch.Tensor) -> None:
    view = tensor.view(torch.uint8).numpy().data
    while view:
        view = view[file.write(view) :]


def _read_exactly(file: FileIO, tensor: torch.Tensor, path: Path) -> None:
    view = tensor.view(torch.uint8).numpy().data
    while view:
        count = file.readinto(view)
        if not count:
            raise UpdateError(f"update {path.name} ends before its last tensor")
        view = view[count:]
