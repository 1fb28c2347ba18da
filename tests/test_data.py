"""Slices to batches: views cut along the sample dimension, interleaved across ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hypha.accelerate_executor.data import DataError, batches_of, load_slice


@pytest.fixture
def slice_file(tmp_path: Path) -> Path:
    samples = torch.arange(10 * 4).reshape(10, 4)
    save_file(
        {"input_ids": samples, "labels": samples + 1000, "extra": torch.zeros(10)}, tmp_path / "17"
    )
    return tmp_path / "17"


def test_batches_are_views_of_the_slice(slice_file: Path) -> None:
    tensors = load_slice(slice_file, ["input_ids", "labels"])
    assert set(tensors) == {"input_ids", "labels"}
    batches = list(batches_of(tensors, batch_size=3, rank=0, world=1))
    assert len(batches) == 3  # 10 samples: the last one fills no batch
    assert batches[1]["input_ids"][0, 0] == 12 and batches[1]["labels"][0, 0] == 1012
    assert batches[0]["input_ids"].data_ptr() == tensors["input_ids"].data_ptr()  # no copy


def test_ranks_take_disjoint_interleaved_batches(slice_file: Path) -> None:
    tensors = load_slice(slice_file, None)
    per_rank = [list(batches_of(tensors, batch_size=2, rank=r, world=2)) for r in (0, 1)]
    assert [len(b) for b in per_rank] == [2, 2]
    firsts = sorted(int(b["input_ids"][0, 0]) for batches in per_rank for b in batches)
    assert firsts == [0, 8, 16, 24]


def test_missing_tensor_is_named(slice_file: Path) -> None:
    with pytest.raises(DataError, match="lacks tensor\\(s\\) pixel_values"):
        load_slice(slice_file, ["pixel_values"])


def test_disagreeing_sample_counts_are_refused(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(4, 2), "b": torch.zeros(5, 2)}, tmp_path / "bad")
    with pytest.raises(DataError, match="disagree"):
        load_slice(tmp_path / "bad", ["a", "b"])
