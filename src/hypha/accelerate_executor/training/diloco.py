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
from dataclasses import dataclass
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

    def merge_update(self, path: Path, keep: bool = False) -> Merged:
        """theta_global += u for every tensor the update holds. With `keep`, u is also
        returned whole (read once: the model-sized update is then held, not streamed), for
        the local weights to move by it too (`moved_by`)."""
        kept: dict[str, torch.Tensor] = {}
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
                if keep:
                    whole = torch.empty(entry.numel, dtype=entry.dtype)
                    _read_exactly(file, whole, path)
                    add_update(theta_global, whole)
                    kept[entry.name] = whole.view(entry.shape)
                    continue
                for start in range(0, entry.numel, CHUNK):
                    stop = min(start + CHUNK, entry.numel)
                    update = self._chunk(entry.dtype, stop - start)
                    _read_exactly(file, update, path)
                    add_update(theta_global[start:stop], update)
        return Merged(len(entries), kept)

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


@dataclass(frozen=True)
class Merged:
    """What merge_update did: how many tensors the update held, and the update itself when
    it was asked to keep it."""

    held: int
    update: dict[str, torch.Tensor]


def add_update(into: torch.Tensor, update: torch.Tensor) -> None:
    """into += update, the way an update moves a tensor of into's dtype: a boolean flips where
    the update is set (it was sent as XOR), a floating tensor adds it (computed in the wider
    of the two dtypes, rounded once), an integer adds it cast to its own dtype (what loading
    a floating update into an integer tensor would do)."""
    if into.dtype == torch.bool:
        into ^= update.to(torch.bool)
    elif into.is_floating_point():
        into += update
    else:
        into += update.to(into.dtype)


def moved_by(
    local: dict[str, torch.Tensor], update: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """theta_local + u on the host, for every tensor of `local` (those u lacks unchanged):
    the local weights of a worker whose training went on past its last send keep that drift
    on top of the round's aggregate."""
    moved = {}
    for name, tensor in local.items():
        here = tensor.detach().to("cpu", copy=True)
        if (delta := update.get(name)) is not None:
            add_update(here, delta)
        moved[name] = here
    return moved


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
