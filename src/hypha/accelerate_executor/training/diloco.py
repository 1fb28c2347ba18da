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

Where the model is sharded (shards.py) each rank keeps theta_global for its own block of every
tensor only, writes its runs of each file at their offsets and reads only its runs of the
update: the files hold full tensors, the bytes one process would write, and no rank ever
assembles the model.

Both files are model-sized, so they stream through a chunk-sized buffer: the subtraction
is written out while it is still in cache, the update is added in as it is read, and no
model-sized temporary is ever allocated (first-touch page faults on one cost more than the
arithmetic).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hypha.accelerate_executor.errors import TensorFileError, UpdateError
from hypha.accelerate_executor.training.shards import Share
from hypha.accelerate_executor.training.tensorfile import TensorEntry, layout, read_layout

if TYPE_CHECKING:
    from hypha.accelerate_executor.training.distributed import Ranks

# Elements [start, stop) of one tensor's block, computed into `out` where they must be.
Slicer = Callable[[int, int, torch.Tensor], torch.Tensor]
# Elements per streamed chunk: 4 MiB of fp32, which stays in a core's cache.
CHUNK = 1 << 20
# Places per tensor that the digest reads.
DIGEST_SAMPLES = 4096


class GlobalWeights:
    """theta_global as this rank holds it: its block of every tensor (shards.py), or the whole
    model on rank 0 and nothing elsewhere where the model's weights are gathered (one process,
    DDP, DeepSpeed). Every method is called on every rank, in the same order; each reads and
    writes only its own runs of the files, at their offsets, and rank 0 writes the header."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        shares: dict[str, Share] | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        """`weights`: this rank's blocks (whole tensors without `shares`); `ranks`: the ranks
        that hold the rest, None for one process."""
        pin = torch.cuda.is_available()
        self.tensors = {
            name: tensor.detach().to("cpu", _kept_dtype(tensor.dtype), copy=True)
            for name, tensor in weights.items()
        }
        if pin:
            self.tensors = {name: tensor.pin_memory() for name, tensor in self.tensors.items()}
        self.shares = shares or {
            name: Share.whole(tuple(tensor.shape)) for name, tensor in self.tensors.items()
        }
        self._ranks = ranks
        self._chunks: dict[torch.dtype, torch.Tensor] = {}

    def write_pseudo_gradient(
        self,
        local: dict[str, torch.Tensor],
        path: Path,
        dtype: torch.dtype = torch.float32,
        weight: float = 1.0,
    ) -> int:
        """Writes theta_local - theta_global for every tensor to `path`; returns its size.
        `local`: this rank's blocks of theta_local. Floating tensors go in `dtype`, the others
        in their own. `weight` (the action protocol's share of the round's samples) scales the
        floating differences, computed in fp32 before the cast; a counter or a mask is never
        scaled."""

        def differences(name: str) -> Slicer:
            theta_global = self.tensors[name].view(-1)
            theta_local = local[name].detach().reshape(-1)

            def difference(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
                here = theta_local[start:stop].to("cpu", out.dtype)
                if out.dtype == torch.bool:  # booleans do not subtract: a change is sent as XOR
                    return torch.bitwise_xor(here, theta_global[start:stop], out=out)
                delta = torch.sub(here, theta_global[start:stop], out=out)
                scaled = weight != 1.0 and out.dtype.is_floating_point
                return delta.mul_(weight) if scaled else delta

            return difference

        return self._write(path, list(local), dtype, differences)

    def write_model(self, path: Path) -> int:
        """theta_global as a safetensors file (what a late joiner loads, and the model a job
        leaves); its size."""

        def values(name: str) -> Slicer:
            theta_global = self.tensors[name].view(-1)
            return lambda start, stop, out: theta_global[start:stop]

        return self._write(path, list(self.shares), None, values, {"format": "pt"})

    def merge_update(self, path: Path, keep: bool = False) -> Merged:
        """theta_global += u for every tensor the update holds. With `keep`, this rank's block
        of u is also returned (read once: the block is then held, not streamed), for the local
        weights to move by it too (`moved_by`)."""
        kept: dict[str, torch.Tensor] = {}
        if not self.tensors:
            return Merged(0, kept)
        with open(path, "rb", buffering=0) as file:
            entries = self._update_entries(file, path)
            for entry in sorted(entries, key=lambda entry: entry.offset):
                theta_global = self.tensors[entry.name].view(-1)
                if keep:
                    whole = torch.empty(theta_global.numel(), dtype=entry.dtype)
                    for start, stop, part in self._read_runs(file, entry, path, whole):
                        add_update(theta_global[start:stop], part)
                    kept[entry.name] = whole.view(self.shares[entry.name].shape)
                    continue
                for start, stop, part in self._read_runs(file, entry, path):
                    add_update(theta_global[start:stop], part)
        return Merged(len(entries), kept)

    def check_update(self, path: Path) -> int:
        """How many tensors the update at `path` holds, once its header is checked against
        the model (what `merge_update` would refuse, without reading the tensors)."""
        with open(path, "rb", buffering=0) as file:
            return len(self._update_entries(file, path))

    def replace_from(self, path: Path) -> int:
        """theta_global = the model file at `path` (a late joiner's start: a peer's
        theta_global); every tensor of the model must be in it. Returns how many it held."""
        if not self.tensors:
            return 0
        try:
            with open(path, "rb", buffering=0) as file:
                entries = self._model_entries(file, path)
                for entry in entries:
                    if entry.name in self.shares:
                        theta_global = self.tensors[entry.name].view(-1)
                        for start, stop, part in self._read_runs(file, entry, path):
                            theta_global[start:stop].copy_(part)
        except OSError as exc:
            raise UpdateError(f"model {path.name} cannot be read: {exc}") from None
        return len(entries)

    def check_model(self, path: Path) -> int:
        """How many tensors the model file at `path` holds, once its header is checked to hold
        every tensor of the model in its shape (what `replace_from` would refuse)."""
        try:
            with open(path, "rb", buffering=0) as file:
                return len(self._model_entries(file, path))
        except OSError as exc:
            raise UpdateError(f"model {path.name} cannot be read: {exc}") from None

    def digest(self) -> int:
        """A 24-bit digest of theta_global, the same on every worker after a round when each
        applied the same aggregate, however each one's model is sharded. 24 bits, so that it
        survives a float32 metric (upstream's `sent-update` metrics are f32) exactly. It
        weighs each sampled element's bits by its name and its place in the full tensor (at
        most 4096 places per tensor, evenly spaced: an aggregate moves them all), so that
        every rank adds its own part and the sum does not depend on who holds what. A
        collective where the model is sharded."""
        total = 0
        for name in sorted(self.shares):
            share = self.shares[name]
            if not share.writes:
                continue
            salt = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=3).digest(), "big")
            stride = max(1, share.full_numel // DIGEST_SAMPLES)
            flat = self.tensors[name].view(-1)
            for full_start, start, length in share.runs:
                first = -(-full_start // stride) * stride
                if first >= full_start + length:
                    continue
                places = torch.arange(first, full_start + length, stride, dtype=torch.int64)
                values = flat[start + first - full_start : start + length : stride]
                total += _weighed_bits(values, places, salt)
        if self._ranks is not None:
            total = self._ranks.sum(total)
        return total & 0xFFFFFF

    def _write(
        self,
        path: Path,
        names: list[str],
        dtype: torch.dtype | None,
        values: Callable[[str], Slicer],
        metadata: dict[str, str] | None = None,
    ) -> int:
        """Every rank writes its runs of `values(name)(start, stop, out)` (elements
        [start, stop) of its block, computed into `out` where it must be computed; `values`
        is asked once a tensor, its slicer once a chunk, which a block of many short runs
        calls often) at their offsets in `path`; rank 0 writes the header. Floating tensors go in `dtype` (None:
        their own), the others in their own. Returns the file's size, once every rank wrote."""
        header, entries = layout(
            [(name, self._wire_dtype(name, dtype), self.shares[name].full_shape) for name in names],
            metadata,
        )
        size = len(header) + sum(entry.nbytes for entry in entries)
        if self.tensors:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Never truncated on open: the other ranks may be writing their runs already.
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                if self._writes_header:
                    _write_all(descriptor, memoryview(header), 0)
                    os.ftruncate(descriptor, size)
                for entry in entries:
                    share = self.shares[entry.name]
                    if not share.writes:
                        continue
                    kept = self.tensors[entry.name].dtype
                    piece = values(entry.name)
                    for full_start, start, length in share.runs:
                        for done in range(0, length, CHUNK):
                            count = min(CHUNK, length - done)
                            begin = start + done
                            chunk = piece(begin, begin + count, self._chunk(kept, count))
                            if chunk.dtype != entry.dtype:
                                chunk = self._chunk(entry.dtype, count).copy_(chunk)
                            place = entry.offset + (full_start + done) * entry.dtype.itemsize
                            _write_all(descriptor, _bytes(chunk), place)
            finally:
                os.close(descriptor)
        if self._ranks is not None:
            self._ranks.barrier()  # the file is whole only once every rank wrote its runs
        return size

    def _read_runs(
        self, file: FileIO, entry: TensorEntry, path: Path, into: torch.Tensor | None = None
    ) -> Iterator[tuple[int, int, torch.Tensor]]:
        """This rank's block of `entry`, run by run in chunks: (start, stop, values) with the
        values of block elements [start, stop), in the file's dtype; read into `into` (the
        whole block) when given, else into a reused chunk."""
        for full_start, start, length in self.shares[entry.name].runs:
            for done in range(0, length, CHUNK):
                count = min(CHUNK, length - done)
                begin = start + done
                part = (
                    into[begin : begin + count]
                    if into is not None
                    else self._chunk(entry.dtype, count)
                )
                place = entry.offset + (full_start + done) * entry.dtype.itemsize
                _read_exactly(file, part, path, place)
                yield begin, begin + count, part

    def _model_entries(self, file: FileIO, path: Path) -> list[TensorEntry]:
        try:
            entries = read_layout(file, os.fstat(file.fileno()).st_size)
        except TensorFileError as exc:
            raise UpdateError(f"model {path.name} cannot be read: {exc}") from None
        missing = sorted(set(self.shares) - {entry.name for entry in entries})
        if missing:
            raise UpdateError(f"model {path.name} lacks {', '.join(missing[:3])}")
        self._check_shapes(path, [entry for entry in entries if entry.name in self.shares], "model")
        return entries

    def _update_entries(self, file: FileIO, path: Path) -> list[TensorEntry]:
        entries = read_layout(file, os.fstat(file.fileno()).st_size)
        unknown = sorted(entry.name for entry in entries if entry.name not in self.shares)
        if unknown:
            raise UpdateError(
                f"update {path.name} holds tensors the model lacks: {', '.join(unknown[:3])}"
            )
        self._check_shapes(path, entries, "update")
        return entries

    def _check_shapes(self, path: Path, entries: list[TensorEntry], what: str) -> None:
        for entry in entries:
            expected = self.shares[entry.name].full_shape
            if entry.shape != expected:
                raise UpdateError(
                    f"{what} {path.name}: {entry.name} has shape {entry.shape}, the model {expected}"
                )

    @property
    def _writes_header(self) -> bool:
        return self._ranks is None or self._ranks.is_main

    def _wire_dtype(self, name: str, dtype: torch.dtype | None) -> torch.dtype:
        kept = self.tensors[name].dtype if name in self.tensors else torch.float32
        return dtype if dtype is not None and kept.is_floating_point else kept

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


def _weighed_bits(values: torch.Tensor, places: torch.Tensor, salt: int) -> int:
    """The sum of each value's bits, folded to 24, times a weight of its place and name: in
    24-bit pieces, so that no product or sum leaves an int64."""
    bits = _bits(values).to(torch.int64)
    bits = (bits ^ (bits >> 24) ^ (bits >> 48)) & 0xFFFFFF
    weights = ((places * 2654435761 + salt) & 0xFFFFFF) | 1
    return int(((bits * weights) & 0xFFFFFF).sum())


def _bits(values: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers of the same width."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return values.contiguous().view(width[values.dtype.itemsize])


def _bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.view(torch.uint8).numpy().data).cast("B")


def _write_all(descriptor: int, view: memoryview, place: int) -> None:
    while view:
        written = os.pwrite(descriptor, view, place)
        view, place = view[written:], place + written


def _read_exactly(file: FileIO, tensor: torch.Tensor, path: Path, place: int) -> None:
    view = _bytes(tensor)
    while view:
        count = os.preadv(file.fileno(), [view], place)
        if not count:
            raise UpdateError(f"update {path.name} ends before its last tensor")
        view, place = view[count:], place + count
