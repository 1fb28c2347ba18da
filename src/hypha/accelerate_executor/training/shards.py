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
    # A flat range instead of a block: elements [offset[0], offset[0] + shape[0]) of the
    # flattened tensor (a ZeRO-3 partition).
    flat: bool = False

    @classmethod
    def whole(cls, shape: tuple[int, ...], writes: bool = True) -> Share:
        return cls(shape, shape, (0,) * len(shape), writes)

    @classmethod
    def flat_range(cls, full_shape: tuple[int, ...], start: int, count: int) -> Share:
        return cls(full_shape, (count,), (start,), writes=True, flat=True)

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
        if self.flat:
            return ((self.offset[0], 0, self.numel),)
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

    state = module.state_dict(keep_vars=True)
    blocks: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    for name in names:
        tensor = state[name]
        full_shape = tuple(tensor.shape)
        if not isinstance(tensor, DTensor):
            blocks[name] = (full_shape, full_shape, (0,) * len(full_shape))
            continue
        shape, offset = block_of(full_shape, tensor.device_mesh, tensor.placements)
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


def block_of(
    full_shape: tuple[int, ...], mesh: Any, placements: Any
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and offset of this rank's block of a DTensor of `full_shape`. Each dimension
    is cut as torch.chunk cuts it (the last pieces may be shorter, or empty), by every mesh
    dimension that shards it: the plain shards in mesh order, then the strided ones, which
    FSDP2 over tensor parallelism places before the tensor-parallel shard although they cut
    its piece (torch 2.8's own compute_local_shape_and_global_offset puts such a block in the
    wrong place)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    coordinate = mesh.get_coordinate() or [0] * mesh.ndim
    shape, offset = list(full_shape), [0] * len(full_shape)
    cuts = [
        (isinstance(placement, _StridedShard), mesh_dim, placement.dim)
        for mesh_dim, placement in enumerate(placements)
        if isinstance(placement, (Shard, _StridedShard))
    ]
    for _strided, mesh_dim, dim in sorted(cuts):  # plain before strided, each in mesh order
        pieces = mesh.size(mesh_dim)
        piece = -(-shape[dim] // pieces)
        start = min(coordinate[mesh_dim] * piece, shape[dim])
        offset[dim] += start
        shape[dim] = min(piece, shape[dim] - start)
    return tuple(shape), tuple(offset)


def is_partitioned(module: torch.nn.Module) -> bool:
    """Whether DeepSpeed's ZeRO-3 partitions the parameters (each rank holds a flat range)."""
    return any(hasattr(parameter, "ds_tensor") for parameter in module.parameters())


def partition_shares(module: torch.nn.Module, names: list[str], rank: int) -> dict[str, Share]:
    """Where this rank's ZeRO-3 partition of each named parameter lies: a flat range of the
    flattened tensor, the padding of the last partition left out; buffers are whole on every
    rank, written by rank 0."""
    parameters: dict[str, Any] = dict(module.named_parameters())  # with DeepSpeed's ds_ fields
    state = module.state_dict(keep_vars=True)
    shares = {}
    for name in names:
        parameter = parameters.get(name)
        if parameter is None or not hasattr(parameter, "ds_tensor"):
            shares[name] = Share.whole(tuple(state[name].shape), writes=rank == 0)
            continue
        size = parameter.ds_tensor.ds_numel  # every rank's partition, padded alike
        start = min(rank * size, parameter.ds_numel)
        count = min(size, parameter.ds_numel - start)
        shares[name] = Share.flat_range(tuple(parameter.ds_shape), start, count)
    return shares


def partition_tensors(module: torch.nn.Module, shares: dict[str, Share]) -> dict[str, torch.Tensor]:
    """This rank's ZeRO-3 partition of each parameter, from the fp32 master weights (never a
    16-bit copy), and every buffer whole."""
    from deepspeed.utils import safe_get_local_fp32_param

    parameters = dict(module.named_parameters())
    state = module.state_dict(keep_vars=True)
    tensors = {}
    for name, share in shares.items():
        if share.flat:
            tensors[name] = safe_get_local_fp32_param(parameters[name])[: share.numel].detach()
        else:
            tensors[name] = state[name].detach()
    return tensors


def load_partitions(
    module: torch.nn.Module, shares: dict[str, Share], values: dict[str, torch.Tensor]
) -> None:
    """`values` (this rank's partitions) into both the fp32 master weights and the model's own
    partitions, which the next forward gathers: the master copy alone would reach the model
    only at the next optimizer step."""
    from deepspeed.utils import safe_get_local_fp32_param, safe_set_local_fp32_param

    parameters = dict(module.named_parameters())
    state = module.state_dict(keep_vars=True)
    for name, share in shares.items():
        if not share.flat:
            state[name].data.copy_(values[name])
            continue
        parameter: Any = parameters[name]  # with DeepSpeed's ds_ fields
        master = safe_get_local_fp32_param(parameter).clone()  # padded as DeepSpeed keeps it
        master[: share.numel].copy_(values[name])
        safe_set_local_fp32_param(parameter, master)
        parameter.ds_tensor.data[: share.numel].copy_(values[name])
