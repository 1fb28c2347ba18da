"""Where a rank's block lies in the full tensor (training/shards.py), with no process group:
the runs a block is written and read by, and the block a DTensor's placements give."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from hypha.accelerate_executor.training.shards import Share, block_of


def elements(share: Share) -> list[int]:
    """The full tensor's flat indices the block holds, in the block's own order."""
    held = [-1] * share.numel
    for full_start, start, length in share.runs:
        held[start : start + length] = range(full_start, full_start + length)
    return held


def test_the_runs_of_a_block_are_its_rows_where_it_spans_the_last_dimension_partly() -> None:
    share = Share((4, 6), (2, 3), (2, 3), writes=True)
    full = torch.arange(24).view(4, 6)
    assert share.runs == ((15, 0, 3), (21, 3, 3))
    assert elements(share) == full[2:4, 3:6].reshape(-1).tolist()


def test_a_block_of_whole_rows_is_one_run_and_an_empty_one_none() -> None:
    assert Share((8, 4), (3, 4), (5, 0), writes=True).runs == ((20, 0, 12),)
    assert Share((8, 4), (0, 4), (8, 0), writes=True).runs == ()
    assert Share.whole((2, 3, 4)).runs == ((0, 0, 24),)


def test_a_three_dimensional_block_walks_its_leading_dimensions() -> None:
    share = Share((2, 4, 6), (2, 2, 6), (0, 1, 0), writes=True)
    full = torch.arange(48).view(2, 4, 6)
    assert elements(share) == full[:, 1:3, :].reshape(-1).tolist()
    assert len(share.runs) == 2  # the middle dimension's slice, whole rows: one run a plane


def test_a_zero_3_partition_is_one_flat_run() -> None:
    share = Share.flat_range((10, 10), start=50, count=34)
    assert share.runs == ((50, 0, 34),) and share.numel == 34 and share.full_numel == 100


@dataclass
class Mesh:
    """What block_of asks of a device mesh: its sizes and this rank's coordinate."""

    sizes: tuple[int, ...]
    coordinate: list[int]

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    def size(self, dim: int) -> int:
        return self.sizes[dim]

    def get_coordinate(self) -> list[int]:
        return self.coordinate


def test_shards_cut_as_torch_chunk_does_the_last_piece_shorter() -> None:
    # 10 rows over 4 ranks: chunks of 3, the last of 1.
    assert block_of((10, 8), Mesh((4,), [3]), [Shard(0)]) == ((1, 8), (9, 0))
    assert block_of((10, 8), Mesh((4,), [1]), [Shard(0)]) == ((3, 8), (3, 0))
    # A replicated mesh dimension cuts nothing.
    assert block_of((10, 8), Mesh((2, 2), [1, 1]), [Replicate(), Shard(1)]) == ((10, 4), (0, 4))


def test_fsdp2_over_tensor_parallelism_cuts_the_tensor_parallel_piece() -> None:
    """(fsdp, tp) = (2, 2), rows sharded by both: tensor parallelism takes its half first, and
    FSDP2's strided shard halves that: rank (i, j) holds rows 32 j + 16 i of 64."""
    placements = [_StridedShard(0, split_factor=2), Shard(0)]
    offsets = {
        (i, j): block_of((64, 8), Mesh((2, 2), [i, j]), placements)[1][0]
        for i in range(2)
        for j in range(2)
    }
    assert offsets == {(0, 0): 0, (1, 0): 16, (0, 1): 32, (1, 1): 48}
