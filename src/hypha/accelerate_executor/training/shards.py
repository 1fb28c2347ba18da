"""Which part of each of the model's tensors this rank holds, in the full tensor's terms.

A sharded model (FSDP2, tensor parallelism, both at once, HSDP) gives every rank a block of
each parameter: a DTensor's local tensor, at an offset in the full tensor that its placements
determine. DiLoCo's outer state and the files a sync round writes and reads are kept in those
terms, so that no rank ever assembles the whole model: in the full tensor's row-major order a
block is a set of runs of consecutive elements, and each rank reads and writes its own runs at
their offsets in a safetensors file (diloco.py). Where a block is replicated (a tensor-parallel
layer norm, HSDP's replicas) only the first replica writes it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Share:
    """One rank's block of one tensor: `shape` at `offset` in the full `full_shape`."""

    full_shape: tuple[int, ...]
    shape: tuple[int, ...]
    offset: tuple[int, ...]
    writes: bool  # this rank writes the block to files (it is the block's first replica)

    @classmethod
    def whole(cls, shape: tuple[int, ...], writes: bool = True) -> Share:
        return cls(shape, shape, (0,) * len(shape), writes)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def full_numel(self) -> int:
        return math.prod(self.full_shape)

    @functools.cached_property
    def runs(self) -> tuple[tuple[int, int, int], ...]:
        """(start in the full tensor, start in the block, length) of every run of the block's
        elements that are consecutive in the full tensor, both flattened row-major."""
        if self.numel == 0:
            return ()
        # The trailing dimensions the block spans whole are one stretch of memory with the
        # dimension before them: a run is that dimension's slice of them.
        split = len(self.shape)
        while split > 0 and self.shape[split - 1] == self.full_shape[split - 1]:
            split -= 1
        if split == 0:
            return ((0, 0, self.numel),)
        tail = math.prod(self.full_shape[split:])
        length = self.shape[split - 1] * tail
        full_strides = _strides(self.full_shape)
        runs = []
        for local_index, index in enumerate(
            itertools.product(*map(range, self.shape[: split - 1]))
        ):
            start = (
                sum((self.offset[dim] + i) * full_strides[dim] for dim, i in enumerate(index))
                + self.offset[split - 1] * full_strides[split - 1]
            )
            runs.append((start, local_index * length, length))
        return tuple(runs)


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides = [1] * len(shape)
    for dim in range(len(shape) - 2, -1, -1):
        strides[dim] = strides[dim + 1] * shape[dim + 1]
    return strides


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether any parameter is a DTensor: FSDP2, tensor parallelism, or both."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in module.parameters())


def local_tensors(module: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """This rank's block of each named state-dict tensor: a DTensor's local tensor (a view of
    the live parameter), a plain tensor whole."""
    from torch.distributed.tensor import DTensor

    state = module.state_dict(keep_vars=True)
    return {
        name: (state[name].to_local() if isinstance(state[name], DTensor) else state[name]).detach()
        for name in names
    }


def shares_of(
    module: torch.nn.Module,
    names: list[str],
    rank: int,
    gather: Callable[[object], list[Any]] | None = None,
) -> dict[str, Share]:
    """Where this rank's block of each named tensor lies. Of the ranks that hold the same
    block (a plain tensor in a sharded model, a Replicate placement, or a tensor whose mesh
    covers only some ranks, as FSDP2's over tensor parallelism leaves a layer norm) the
    lowest writes it. `gather`: every rank's value of its argument, in rank order (a
    collective); None for one process."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    state = module.state_dict(keep_vars=True)
    blocks: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    for name in names:
        tensor = state[name]
        full_shape = tuple(tensor.shape)
        if not isinstance(tensor, DTensor):
            blocks[name] = (full_shape, full_shape, (0,) * len(full_shape))
            continue
        shape, offset = compute_local_shape_and_global_offset(
            full_shape, tensor.device_mesh, tensor.placements
        )
        local_shape = tuple(tensor.to_local().shape)
        if tuple(shape) != local_shape:
            raise ValueError(
                f"{name}: the local block is {local_shape}, its placements {tensor.placements} "
                f"say {tuple(shape)}"
            )
        blocks[name] = (full_shape, local_shape, tuple(offset))
    everyone = gather(blocks) if gather is not None else [blocks]
    shares = {}
    for name, (full_shape, shape, offset) in blocks.items():
        first = next(
            index for index, held in enumerate(everyone) if held[name][1:] == (shape, offset)
        )
        shares[name] = Share(full_shape, shape, offset, writes=first == rank)
    return shares
