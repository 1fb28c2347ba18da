"""Slices to batches: views cut along the sample dimension, interleaved across ranks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hypha.accelerate_executor.data import (
    READ_WHOLE_BYTES,
    DataError,
    batches_of,
    load_slice,
)
from hypha.accelerate_executor.errors import ExecutorError
from hypha.accelerate_executor.tensorfile import layout


@pytest.fixture
def slice_file(tmp_path: Path) -> Path:
    samples = torch.arange(10 * 4).reshape(10, 4)
    save_file(
        {"input_ids": samples, "labels": samples + 1000, "extra": torch.zeros(10)}, tmp_path / "17"
    )
    return tmp_path / "17"


@pytest.fixture
def large_slice_file(tmp_path: Path) -> Path:
    """A slice above READ_WHOLE_BYTES, so that it is mapped rather than read."""
    samples = torch.arange(2050 * 80).reshape(2050, 80)
    save_file({"input_ids": samples, "labels": samples + 1}, tmp_path / "18")
    assert (tmp_path / "18").stat().st_size > READ_WHOLE_BYTES
    return tmp_path / "18"


def reference_batches(
    tensors: dict[str, torch.Tensor], batch_size: int, rank: int, world: int
) -> list[dict[str, torch.Tensor]]:
    """Batches the plain way: rank r takes batches r, r + world, ...; the remainder is dropped."""
    samples = len(next(iter(tensors.values())))
    usable = samples // (batch_size * world) * batch_size * world
    starts = range(rank * batch_size, usable, batch_size * world)
    return [
        {name: t[start : start + batch_size] for name, t in tensors.items()} for start in starts
    ]


def assert_same_batches(
    got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]
) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[name], b[name]) for name in a)


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


@pytest.mark.parametrize(("batch_size", "world"), [(1, 1), (3, 1), (2, 2), (3, 3), (4, 2), (7, 1)])
def test_batches_match_plain_slicing_for_every_rank(batch_size: int, world: int) -> None:
    base = torch.arange(23 * 6).reshape(23, 6)
    # A non-contiguous tensor too: batches_of must follow strides, not assume a layout.
    tensors = {"a": base, "b": base.t().contiguous().t(), "c": base[:, ::2], "d": base[:, 0]}
    for rank in range(world):
        got = list(batches_of(tensors, batch_size, rank, world))
        assert_same_batches(got, reference_batches(tensors, batch_size, rank, world))


def test_slice_above_the_read_limit_gives_the_same_batches(large_slice_file: Path) -> None:
    tensors = load_slice(large_slice_file, ["input_ids", "labels"])
    expected = torch.arange(2050 * 80).reshape(2050, 80)
    assert torch.equal(tensors["input_ids"], expected)
    for rank in (0, 1):
        got = list(batches_of(tensors, batch_size=8, rank=rank, world=2))
        assert len(got) == 2050 // 16
        assert_same_batches(
            got, reference_batches({"input_ids": expected, "labels": expected + 1}, 8, rank, 2)
        )


def test_writing_into_a_batch_leaves_the_file_unchanged(
    slice_file: Path, large_slice_file: Path
) -> None:
    for path in (slice_file, large_slice_file):
        before = path.read_bytes()
        batch = next(batches_of(load_slice(path, ["input_ids"]), 2, rank=0, world=1))
        batch["input_ids"].fill_(-1)
        assert path.read_bytes() == before


def test_unaligned_tensor_is_copied_to_aligned_memory(tmp_path: Path) -> None:
    # safetensors' own writer orders tensors so that offsets are aligned; other writers need
    # not: one odd-sized uint8 tensor first puts the int64 one at an odd offset.
    ids = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    flags = torch.tensor([1, 0, 1], dtype=torch.uint8)
    header, entries = layout([("flags", torch.uint8, (3,)), ("ids", torch.int64, (3, 4))])
    assert entries[1].offset % 8 != 0
    (tmp_path / "odd").write_bytes(header + flags.numpy().tobytes() + ids.numpy().tobytes())
    tensors = load_slice(tmp_path / "odd", None)
    assert torch.equal(tensors["ids"], ids) and torch.equal(tensors["flags"], flags)
    assert tensors["ids"].data_ptr() % 8 == 0


def test_empty_tensors_give_empty_batches(tmp_path: Path) -> None:
    save_file({"ids": torch.ones(4, 2), "none": torch.zeros(4, 0)}, tmp_path / "empty")
    batches = list(batches_of(load_slice(tmp_path / "empty", None), 2, rank=0, world=1))
    assert [tuple(b["none"].shape) for b in batches] == [(2, 0), (2, 0)]


def test_missing_tensor_is_named(slice_file: Path) -> None:
    with pytest.raises(DataError, match="lacks tensor\\(s\\) pixel_values"):
        load_slice(slice_file, ["pixel_values"])


def test_disagreeing_sample_counts_are_refused(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(4, 2), "b": torch.zeros(5, 2)}, tmp_path / "bad")
    with pytest.raises(DataError, match="disagree"):
        load_slice(tmp_path / "bad", ["a", "b"])


def test_scalar_tensors_are_refused(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(4, 2), "step": torch.tensor(3)}, tmp_path / "scalar")
    with pytest.raises(DataError, match="step are scalars"):
        load_slice(tmp_path / "scalar", None)


def test_missing_file_is_one_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data slice gone cannot be read: No such file"):
        load_slice(tmp_path / "gone", None)


MALFORMED: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda valid: b"",
    "too short": lambda valid: valid[:5],
    "cut in the header": lambda valid: valid[:20],
    "cut in the data": lambda valid: valid[:-100],
    "garbage": lambda valid: bytes(range(256)) * 4,
    "header not JSON": lambda valid: (16).to_bytes(8, "little") + b"\xff" * 16 + valid[-64:],
    "header not an object": lambda valid: (8).to_bytes(8, "little") + b"[1, 2] " + b" ",
    "unknown dtype": lambda valid: valid.replace(b'"I64"', b'"X64"', 1),
}


@pytest.mark.parametrize("damage", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_file_is_one_executor_error_line(
    slice_file: Path, tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    broken = tmp_path / "broken-slice"
    broken.write_bytes(damage(slice_file.read_bytes()))
    with pytest.raises(ExecutorError) as raised:
        load_slice(broken, ["input_ids"])
    message = str(raised.value)
    assert "broken-slice" in message and "\n" not in message, message
