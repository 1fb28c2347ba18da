"""Data slices (safetensors files from the bridge) to the worker's batches.

The worker's batch is `batch_size` samples, whatever the slices hold: batches run across
slice boundaries, every sample of a slice is trained once, in order, before the next
slice's. With N processes each rank takes its share of every batch (the remainder spread
over the first ranks), so the worker trains exactly `batch_size` samples per step.

A slice file is read with one read into one buffer (mapped instead, when it is large) and
its tensors are views of that buffer; a rank's share is a view of one slice, or a copy
joining the pieces where it crosses a boundary. Rank 0 fetches, one slice ahead, and moves
each fetched file to a name of the executor's own at once: the worker's bridge rewrites
`artifacts/<index>` in place when it hands the same index out again, which would change a
file under a live mapping (SIGBUS). Every rank reads the moved file.

Action-era data nodes serve each slice as one raw Snappy block of a safetensors file
(`artifacts/<hash>`); alpha.17's serve the safetensors file itself. The bytes tell which
(`is_plain_safetensors`): both load. A Git LFS pointer in a slice's place (a data node serving a
repository cloned without its LFS files) is named as such.

A fetched slice is checked whole (its layout read, a Snappy block decompressed) on the fetching
thread, ahead of training. Upstream's bridge returns a cached `artifacts/<hash>` unchecked, and
a download that failed mid-way leaves one truncated there for the bridge's own retry to find
(docs/faults.md): such a slice is deleted, which also empties the bridge's cache entry (the
file was moved out of it), and fetched again, a few times in a row at most.
"""

from __future__ import annotations

import io
import itertools
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from hypha.accelerate_executor.bridge.client import BridgeClient
from hypha.accelerate_executor.errors import DataError, TensorFileError
from hypha.accelerate_executor.protocol.job import FetchedReference
from hypha.accelerate_executor.training.distributed import Ranks
from hypha.accelerate_executor.training.tensorfile import TensorEntry, read_layout

Batch = dict[str, torch.Tensor]
# A slice up to this size is read whole, a larger one is mapped. Counting the page faults that
# training pays when it first touches a mapping, one read is the cheaper at 1 MiB and not at
# 4 MiB (2-core x86 Linux, read then summed: 64 KiB 7 us vs 16 us mapped; 1 MiB 55 vs 73 us;
# 4 MiB 175 vs 63 us).
READ_WHOLE_BYTES = 1 << 20
# Where fetched slices are moved to, under the work dir: names only the executor uses.
OWN_SLICES_DIR = "slices"
# How many fetches in a row may hand out a broken slice before the job ends.
BROKEN_SLICE_FETCHES = 3
# The label transformers' losses skip: padding, and whatever else should teach nothing.
IGNORED_LABEL = -100
# Padding where token rows of different lengths meet in one batch: `labels` are ignored,
# everything else pads with 0 (attention_mask 0).
PAD_VALUES = {"labels": IGNORED_LABEL}


@dataclass(frozen=True)
class Share:
    """One rank's part of every worker batch: samples [start, start + size)."""

    start: int
    size: int

    @classmethod
    def of(cls, batch_size: int, rank: int, world: int) -> Share:
        base, extra = divmod(batch_size, world)
        return cls(rank * base + min(rank, extra), base + (rank < extra))


def load_slice(path: Path, required: list[str] | None, optional: tuple[str, ...] = ()) -> Batch:
    """The `required` tensors of a slice file (all of them for None) and those of `optional`
    it holds, as views of one buffer. A file that is not a safetensors file raises
    TensorFileError, an ExecutorError."""
    entries, contents = _read_slice(path)
    names = sorted(entries) if required is None else list(required)
    missing = [name for name in names if name not in entries]
    if missing:
        raise DataError(
            f"data slice {path.name} lacks tensor(s) {', '.join(missing)}; "
            f"it holds {', '.join(sorted(entries)) or 'nothing'}"
        )
    names += [name for name in optional if name in entries and name not in names]
    scalars = [name for name in names if not entries[name].shape]
    if scalars:
        raise DataError(
            f"data slice {path.name}: tensor(s) {', '.join(scalars)} are scalars, "
            "with no sample dimension"
        )
    if len({entries[name].shape[0] for name in names}) != 1:
        raise DataError(f"data slice {path.name}: tensors disagree on the number of samples")
    return {name: _view(contents, entries[name]) for name in names}


def worker_batches(slices: Iterator[Batch], batch_size: int, share: Share) -> Iterator[Batch]:
    """This rank's share of each worker batch of `batch_size` samples, cut from the slices
    in order and across their boundaries. A share within one slice is a view of it."""
    pieces: list[Batch] = []
    filled = 0  # samples of the current worker batch taken so far
    for tensors in slices:
        samples = next(iter(tensors.values())).shape[0]
        cursor = 0
        while cursor < samples:
            take = min(batch_size - filled, samples - cursor)
            low = max(filled, share.start)
            high = min(filled + take, share.start + share.size)
            if low < high:
                begin, end = cursor + low - filled, cursor + high - filled
                pieces.append({name: tensor[begin:end] for name, tensor in tensors.items()})
            filled += take
            cursor += take
            if filled == batch_size:
                yield pieces[0] if len(pieces) == 1 else join(pieces)
                pieces, filled = [], 0


def join(pieces: list[Batch]) -> Batch:
    """Pieces of one batch from different slices, concatenated along the sample dimension.
    Token rows of different lengths are padded to the longest (see PAD_VALUES)."""
    names = pieces[0].keys()
    if any(piece.keys() != names for piece in pieces):
        raise DataError("consecutive data slices hold different tensors")
    return {name: _concatenate(name, [piece[name] for piece in pieces]) for name in names}


def _concatenate(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if len({part.shape[1:] for part in parts}) == 1:
        return torch.cat(parts)
    if parts[0].is_floating_point() or len({part.dim() for part in parts}) != 1:
        raise DataError(
            f"tensor {name} has per-sample shapes {sorted({tuple(p.shape[1:]) for p in parts})} "
            "in consecutive slices; only token rows may differ in length"
        )
    trailing = [max(sizes) for sizes in zip(*(part.shape[1:] for part in parts), strict=True)]
    out = parts[0].new_full(
        (sum(part.shape[0] for part in parts), *trailing), PAD_VALUES.get(name, 0)
    )
    row = 0
    for part in parts:
        out[(slice(row, row + part.shape[0]), *map(slice, part.shape[1:]))] = part
        row += part.shape[0]
    return out


def is_plain_safetensors(head: bytes, size: int) -> bool:
    """Whether a file of `size` bytes starting with `head` (at least 9 bytes of it) is a
    safetensors file rather than a Snappy block of one. A safetensors file opens with its
    header's length (u64, little-endian) and the header's `{`; a Snappy block opens with the
    uncompressed length as a varint and a literal's tag, so its first 8 bytes read as a
    length far past the file's end (or its ninth is not the `{`)."""
    if len(head) < 9:
        return True  # too short for either: read_layout says why
    (header_bytes,) = struct.unpack("<Q", head[:8])
    return header_bytes <= size - 8 and head[8:9] == b"{"


# How a Git LFS pointer file opens (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md):
# what a repository cloned without `git lfs pull` holds in each large file's place.
GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/"
HEAD_BYTES = len(GIT_LFS_POINTER)


def refuse_git_lfs_pointer(path: Path, head: bytes, size: int) -> None:
    """Raises DataError naming the cause when the slice is a Git LFS pointer (upstream's
    troubleshooting guide, hypha-space/hypha docs/content/troubleshooting.md @ 08b44721:
    "Snappy decompression failure", the copied `size=131`)."""
    if head.startswith(GIT_LFS_POINTER):
        raise DataError(
            f"data slice {path.name} is a Git LFS pointer ({size} bytes starting "
            f"`{GIT_LFS_POINTER.decode()}v1`), not the slice: the data node's dataset "
            "repository was cloned without its LFS files; run `git lfs pull` in it "
            "(git-lfs installed) and serve the dataset again"
        )


class BrokenSlice(DataError):
    """A slice's bytes are not whole: a download cut short, or bytes changed on the way."""


def _uncompressed_slice(path: Path, file: io.FileIO, size: int) -> bytearray:
    import cramjam  # the executor's Snappy codec (pyproject's train extra)

    compressed = bytearray(size)
    if os.preadv(file.fileno(), [compressed], 0) != size:
        raise DataError(f"data slice {path.name} shrank while it was read")
    try:
        return bytearray(cramjam.snappy.decompress_raw(bytes(compressed)))
    except cramjam.DecompressionError:
        raise BrokenSlice(
            f"data slice {path.name} is neither a safetensors file nor a Snappy block of one"
        ) from None


def _read_slice(path: Path) -> tuple[dict[str, TensorEntry], bytearray | mmap.mmap]:
    try:
        with open(path, "rb", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            head = os.pread(file.fileno(), HEAD_BYTES, 0)
            refuse_git_lfs_pointer(path, head, size)
            if not is_plain_safetensors(head, size):
                plain = _uncompressed_slice(path, file, size)
                buffer = io.BytesIO(plain)
                buffer.name = path.name
                entries = read_layout(buffer, len(plain))
                return {entry.name: entry for entry in entries}, plain
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


class SliceStream:
    """Endless batches of this rank's share: scheduler slices are fetched one ahead in the
    background, each read once; uri/huggingface data is fetched once and cycled."""

    def __init__(
        self,
        bridge: BridgeClient | None,
        work_dir: Path,
        reference: FetchedReference,
        names: tuple[list[str], tuple[str, ...]],
        batch_size: int,
        ranks: Ranks,
    ) -> None:
        """`names`: the tensors a slice must hold, and those taken when it holds them."""
        if batch_size < ranks.data_count:
            raise DataError(
                f"batch_size {batch_size} is smaller than the {ranks.data_count} processes "
                "sharing it"
            )
        self._bridge = bridge
        self._own_dir = work_dir / OWN_SLICES_DIR
        self._reference = reference
        self._required, self._optional = names
        self._batch_size = batch_size
        self._share = Share.of(batch_size, ranks.data_index, ranks.data_count)
        self._ranks = ranks
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hypha-fetch")
        self._next: Future[Path] | None = None
        self._fetched = itertools.count()
        self._static_files: Iterator[Path] | None = None
        self._previous: Path | None = None

    @property
    def share(self) -> Share:
        return self._share

    def __iter__(self) -> Iterator[Batch]:
        return worker_batches(self._slices(), self._batch_size, self._share)

    def close(self, wait: bool = False) -> None:
        """Stops fetching ahead; with `wait`, returns once a fetch in flight has ended."""
        self._fetcher.shutdown(wait=wait, cancel_futures=True)

    def _slices(self) -> Iterator[Batch]:
        while True:
            path = Path(self._ranks.share(str(self._next_path()) if self._ranks.is_main else ""))
            tensors = load_slice(path, self._required, self._optional)
            self._forget_previous(path)
            yield tensors

    def _next_path(self) -> Path:
        if self._reference.type != "scheduler":
            if self._static_files is None:
                self._static_files = itertools.cycle(self._fetch_files())
            return next(self._static_files)
        pending = self._next or self._fetcher.submit(self._fetch_slice)
        self._next = self._fetcher.submit(self._fetch_slice)
        return pending.result()

    def _fetch_files(self) -> list[Path]:
        assert self._bridge is not None
        return [entry.path for entry in self._bridge.fetch(self._reference)]

    def _fetch_slice(self) -> Path:
        """The next whole slice, under a name of our own; a broken one is deleted and
        another fetched, up to BROKEN_SLICE_FETCHES in a row."""
        for fetches in itertools.count(1):
            path = self._fetch_one_slice()
            try:
                _read_slice(path)
                return path
            except (BrokenSlice, TensorFileError) as exc:
                path.unlink(missing_ok=True)
                if fetches == BROKEN_SLICE_FETCHES:
                    raise BrokenSlice(f"{exc} ({fetches} broken slices in a row)") from None
                print(f"warning: {exc}; deleted it, fetching again", file=sys.stderr)
        raise AssertionError("unreachable")

    def _fetch_one_slice(self) -> Path:
        """Fetches the next slice and moves it to a name of our own before anything else
        reaches the bridge: the next fetch may rewrite the bridge's file in place."""
        files = self._fetch_files()
        if len(files) != 1:
            raise DataError(f"the bridge answered a data fetch with {len(files)} files, expected 1")
        own = self._own_dir / f"{next(self._fetched)}-{files[0].name}"
        try:
            self._own_dir.mkdir(exist_ok=True)
            os.replace(files[0], own)
        except OSError as exc:
            raise DataError(f"data slice {files[0].name} cannot be moved: {exc.strerror}") from None
        return own

    def _forget_previous(self, current: Path) -> None:
        # Scheduler slices are read once: delete the last one so a long job's work dir stays
        # small. Every rank loaded it a whole slice ago (the paths travel by collectives).
        if self._ranks.is_main and self._reference.type == "scheduler":
            if self._previous is not None:
                self._previous.unlink(missing_ok=True)
            self._previous = current
