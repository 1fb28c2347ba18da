"""DiLoCo's outer state on a worker: the global weights a round starts from.

theta_global lives in host memory for the whole job (pinned when a GPU is present, for fast
copies), never re-read from disk: floating tensors in fp32, integer and boolean ones (a
BatchNorm's counter, a mask buffer) in their own dtype. At a sync point the worker sends
theta_local - theta_global, floating tensors in the pseudo-gradient dtype and the others in
their own, as upstream's executor does (a boolean's change is sent as local XOR global,
since booleans do not subtract). When the parameter server's update u arrives, theta_global
becomes theta_global + u for every tensor it holds, and is loaded into the model; a tensor
the update leaves out (Hypha's parameter server cannot load booleans, int8, int16, uint64 or
float8) keeps its global value.

Both files are model-sized, so they stream through a chunk-sized buffer: the subtraction
is written out while it is still in cache, the update is added in as it is read, and no
model-sized temporary is ever allocated (first-touch page faults on one cost more than the
arithmetic).
"""

from __future__ import annotations

import hashlib
import os
from io import FileIO
from pathlib import Path

import torch

from hypha.accelerate_executor.errors import UpdateError
from hypha.accelerate_executor.training.tensorfile import layout, read_layout

# Elements per streamed chunk: 4 MiB of fp32, which stays in a core's cache.
CHUNK = 1 << 20


class GlobalWeights:
    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        pin = torch.cuda.is_available()
        self.tensors = {
            name: tensor.detach().to("cpu", _kept_dtype(tensor.dtype), copy=True)
            for name, tensor in weights.items()
        }
        if pin:
            self.tensors = {name: tensor.pin_memory() for name, tensor in self.tensors.items()}
        self._chunks: dict[torch.dtype, torch.Tensor] = {}

    def write_pseudo_gradient(
        self,
        local: dict[str, torch.Tensor],
        path: Path,
        dtype: torch.dtype = torch.float32,
        weight: float = 1.0,
    ) -> int:
        """Writes theta_local - theta_global for every tensor to `path`; returns its size.
        Floating tensors go in `dtype`, the others in their own. `weight` (the action
        protocol's share of the round's samples) scales the floating differences, computed
        in fp32 before the cast; a counter or a mask is never scaled."""
        header, entries = layout(
            [
                (name, self._wire_dtype(name, dtype), tuple(self.tensors[name].shape))
                for name in local
            ]
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb", buffering=0) as file:
            file.write(header)
            for entry in entries:
                theta_global = self.tensors[entry.name].view(-1)
                kept = theta_global.dtype
                theta_local = local[entry.name].detach().to("cpu", kept).reshape(-1)
                difference = torch.bitwise_xor if kept == torch.bool else torch.sub
                for start in range(0, entry.numel, CHUNK):
                    stop = min(start + CHUNK, entry.numel)
                    delta = difference(
                        theta_local[start:stop],
                        theta_global[start:stop],
                        out=self._chunk(kept, stop - start),
                    )
                    if weight != 1.0 and kept.is_floating_point:
                        delta.mul_(weight)
                    if entry.dtype != kept:
                        delta = self._chunk(entry.dtype, stop - start).copy_(delta)
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
                kept = theta_global.dtype
                file.seek(entry.offset)
                for start in range(0, entry.numel, CHUNK):
                    stop = min(start + CHUNK, entry.numel)
                    update = self._chunk(entry.dtype, stop - start)
                    _read_exactly(file, update, path)
                    if kept == torch.bool:
                        theta_global[start:stop] ^= update.to(torch.bool)
                    elif kept.is_floating_point:
                        theta_global[start:stop] += update
                    else:  # what loading a floating update into an integer tensor would do
                        theta_global[start:stop] += update.to(kept)
        return len(entries)

    def replace_from(self, path: Path) -> int:
        """theta_global = the model file at `path` (a late joiner's start: a peer's
        theta_global); every tensor of the model must be in it. Returns how many it held."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            received = load_file(path)
        except (SafetensorError, OSError) as exc:
            raise UpdateError(f"model {path.name} cannot be read: {exc}") from None
        missing = sorted(set(self.tensors) - set(received))
        if missing:
            raise UpdateError(f"model {path.name} lacks {', '.join(missing[:3])}")
        for name, tensor in self.tensors.items():
            if received[name].shape != tensor.shape:
                raise UpdateError(
                    f"model {path.name}: {name} has shape {tuple(received[name].shape)}, "
                    f"the model {tuple(tensor.shape)}"
                )
            tensor.copy_(received[name])
        return len(received)

    def digest(self) -> int:
        """A 24-bit BLAKE2b digest of theta_global, names and bytes in name order: the same
        on every worker after a round when each applied the same aggregate. 24 bits, so
        that it survives a float32 metric (upstream's `sent-update` metrics are f32) exactly."""
        hasher = hashlib.blake2b(digest_size=3)
        for name in sorted(self.tensors):
            hasher.update(name.encode())
            tensor = self.tensors[name].contiguous()
            hasher.update(tensor.view(-1).view(torch.uint8).numpy().data)
        return int.from_bytes(hasher.digest(), "big")

    def write_model(self, path: Path) -> int:
        """theta_global as a safetensors file (what a late joiner loads); its size."""
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({name: tensor.contiguous() for name, tensor in self.tensors.items()}, path)
        return path.stat().st_size

    def _wire_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        kept = self.tensors[name].dtype
        return dtype if kept.is_floating_point else kept

    def _chunk(self, dtype: torch.dtype, elements: int) -> torch.Tensor:
        if dtype not in self._chunks:
            self._chunks[dtype] = torch.empty(CHUNK, dtype=dtype)
        return self._chunks[dtype][:elements]


def _kept_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype.is_floating_point else dtype


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
