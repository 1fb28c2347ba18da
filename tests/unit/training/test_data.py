"""Slices to the worker's batches: across slice boundaries, shared by ranks, files owned."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hypha.accelerate_executor.bridge.client import BridgeClient
from hypha.accelerate_executor.errors import DataError, ExecutorError
from hypha.accelerate_executor.protocol.job import SchedulerReference
from hypha.accelerate_executor.training.data import (
    OWN_SLICES_DIR,
    READ_WHOLE_BYTES,
    Batch,
    Share,
    SliceStream,
    is_plain_safetensors,
    load_slice,
    worker_batches,
)
from hypha.accelerate_executor.training.tensorfile import layout
from unix_http import QuietHandler, serving


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


def numbered_slices(sizes: list[int]) -> list[Batch]:
    """Slices whose samples are numbered 0, 1, 2, ... across all of them."""
    slices, first = [], 0
    for size in sizes:
        ids = torch.arange(first, first + size)
        slices.append({"ids": ids, "rows": torch.stack([ids, -ids], dim=1)})
        first += size
    return slices


def samples_of(batches: list[Batch]) -> list[list[int]]:
    return [batch["ids"].tolist() for batch in batches]


@pytest.mark.parametrize(
    ("batch_size", "world", "shares"),
    [(600, 1, [600]), (600, 2, [300, 300]), (7, 3, [3, 2, 2]), (5, 4, [2, 1, 1, 1])],
)
def test_shares_cover_the_worker_batch_with_the_remainder_first(
    batch_size: int, world: int, shares: list[int]
) -> None:
    got = [Share.of(batch_size, rank, world) for rank in range(world)]
    assert [share.size for share in got] == shares
    assert [share.start for share in got] == [sum(shares[:rank]) for rank in range(world)]


@pytest.mark.parametrize("sizes", [[1000, 1000, 1000], [10, 3, 7, 1, 20], [250] * 8])
def test_batches_cross_slices_and_take_every_sample_once_in_order(sizes: list[int]) -> None:
    batch_size = 600 if sizes[0] == 1000 else 6
    batches = list(worker_batches(iter(numbered_slices(sizes)), batch_size, Share(0, batch_size)))
    trained = [sample for batch in samples_of(batches) for sample in batch]
    assert trained == list(range(len(trained)))  # in order, none skipped, none twice
    assert all(len(batch["ids"]) == batch_size for batch in batches)
    assert sum(sizes) - len(trained) < batch_size  # only the unfinished batch is left
    for batch in batches:
        assert torch.equal(batch["rows"][:, 0], batch["ids"])  # tensors stay aligned


def test_ranks_train_the_worker_batch_between_them() -> None:
    sizes, batch_size, world = [10, 3, 7, 1, 20], 7, 3
    per_rank = [
        samples_of(
            list(worker_batches(iter(numbered_slices(sizes)), batch_size, Share.of(7, r, world)))
        )
        for r in range(world)
    ]
    for step, shares in enumerate(zip(*per_rank, strict=True)):
        assert [n for share in shares for n in share] == list(range(7 * step, 7 * step + 7))


def test_a_share_within_one_slice_is_a_view() -> None:
    (first,) = numbered_slices([20])
    batch = next(worker_batches(iter([first]), 8, Share(2, 4)))
    assert batch["ids"].tolist() == [2, 3, 4, 5]
    assert batch["ids"].data_ptr() == first["ids"][2:].data_ptr()  # no copy


def test_token_rows_of_different_lengths_are_padded_where_slices_meet() -> None:
    short = {"input_ids": torch.ones(2, 3, dtype=torch.int64), "labels": torch.ones(2, 3)}
    long = {"input_ids": torch.full((2, 5), 2), "labels": torch.full((2, 5), 2.0)}
    short["labels"] = short["labels"].long()
    long["labels"] = long["labels"].long()
    (batch,) = worker_batches(iter([short, long]), 4, Share(0, 4))
    assert batch["input_ids"].tolist()[1] == [1, 1, 1, 0, 0]
    assert batch["labels"].tolist()[1] == [1, 1, 1, -100, -100]
    assert batch["input_ids"].tolist()[2] == [2] * 5


def test_images_of_different_shapes_in_one_batch_are_refused() -> None:
    slices = [{"images": torch.zeros(2, 1, 28, 28)}, {"images": torch.zeros(2, 1, 32, 32)}]
    with pytest.raises(DataError, match="tensor images has per-sample shapes"):
        list(worker_batches(iter(slices), 4, Share(0, 4)))


def test_slice_above_the_read_limit_gives_the_same_batches(large_slice_file: Path) -> None:
    tensors = load_slice(large_slice_file, ["input_ids", "labels"])
    expected = torch.arange(2050 * 80).reshape(2050, 80)
    assert torch.equal(tensors["input_ids"], expected)
    batches = list(worker_batches(iter([tensors]), 16, Share(8, 8)))
    assert len(batches) == 2050 // 16
    assert torch.equal(batches[3]["input_ids"], expected[3 * 16 + 8 : 4 * 16])


def test_optional_tensors_are_taken_when_present(slice_file: Path) -> None:
    tensors = load_slice(slice_file, ["input_ids"], optional=("attention_mask", "labels"))
    assert sorted(tensors) == ["input_ids", "labels"]


def in_place_bridge(work_dir: Path, slices: list[Batch]) -> type[QuietHandler]:
    """A bridge whose every fetch hands out slice index 0, written into artifacts/0 in place
    as the Rust bridge does (File::create: truncate the same inode, then write)."""
    payloads = iter(slices)

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            target = work_dir / "artifacts" / "0"
            target.parent.mkdir(exist_ok=True)
            staged = work_dir / "staged"
            save_file(next(payloads), staged)
            with open(target, "r+b" if target.exists() else "wb") as out:
                out.truncate(0)
                out.write(staged.read_bytes())
            self.reply_json([{"path": "artifacts/0", "size": target.stat().st_size}])

    return Handler


class OneRank:
    index, count, is_main = 0, 1, True
    data_index, data_count = 0, 1

    def share(self, value: object) -> object:
        return value


def test_a_slice_rewritten_in_place_never_changes_what_is_trained(short_tmp: Path) -> None:
    """Slices over READ_WHOLE_BYTES, so the executor maps them; the same index each time, so
    the bridge truncates and rewrites the file a batch still reads from (SIGBUS, had the
    executor mapped the bridge's file)."""
    samples = READ_WHOLE_BYTES // (8 * 64) + 100
    slices = [
        {
            "ids": torch.arange(n * samples, (n + 1) * samples),
            "pad": torch.zeros(samples, 64, dtype=torch.float64),
        }
        for n in range(12)
    ]
    with serving(short_tmp / "bridge.sock", in_place_bridge(short_tmp, slices)):
        bridge = BridgeClient(short_tmp / "bridge.sock", short_tmp)
        reference = SchedulerReference(type="scheduler", peer="12D3KooWsched", dataset="d")
        stream = SliceStream(bridge, short_tmp, reference, (["ids", "pad"], ()), 1000, OneRank())  # type: ignore[arg-type]
        batches = iter(stream)
        for step in range(5 * samples // 1000):
            batch = next(batches)
            assert batch["ids"].tolist() == list(range(step * 1000, (step + 1) * 1000))
        stream.close()
    # Only the slices still in use are kept, under the executor's own names.
    assert len(list((short_tmp / OWN_SLICES_DIR).iterdir())) <= 2


def test_writing_into_a_batch_leaves_the_file_unchanged(
    slice_file: Path, large_slice_file: Path
) -> None:
    for path in (slice_file, large_slice_file):
        before = path.read_bytes()
        batch = next(worker_batches(iter([load_slice(path, ["input_ids"])]), 2, Share(0, 2)))
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
    batches = list(worker_batches(iter([load_slice(tmp_path / "empty", None)]), 2, Share(0, 2)))
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


def test_a_snappy_block_of_a_slice_loads_as_the_slice_itself(
    slice_file: Path, tmp_path: Path
) -> None:
    """Action-era data nodes serve a slice as one raw Snappy block of its safetensors file
    (upstream's dataset.py: snappy.uncompress); the bytes tell the two apart."""
    import cramjam

    plain = slice_file.read_bytes()
    compressed = tmp_path / "4611686018427387904"
    compressed.write_bytes(bytes(cramjam.snappy.compress_raw(plain)))
    assert not is_plain_safetensors(compressed.read_bytes()[:9], compressed.stat().st_size)
    assert is_plain_safetensors(plain[:9], len(plain))
    expected = load_slice(slice_file, None)
    loaded = load_slice(compressed, None)
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor)


def test_a_snappy_block_that_is_no_slice_is_one_data_error(tmp_path: Path) -> None:
    import cramjam

    damaged = bytearray(cramjam.snappy.compress_raw(b"not a safetensors file " * 40))
    damaged[5:] = b"\xff" * (len(damaged) - 5)
    path = tmp_path / "12345"
    path.write_bytes(bytes(damaged))
    with pytest.raises(DataError, match="12345 is neither a safetensors file nor a Snappy block"):
        load_slice(path, None)


def test_a_git_lfs_pointer_in_a_slices_place_is_named_with_its_cause(tmp_path: Path) -> None:
    """What a data node serving a dataset repository cloned without `git lfs pull` sends: the
    ~131-byte pointer (upstream's troubleshooting guide, "Snappy decompression failure")."""
    pointer = (
        b"version https://git-lfs.github.com/spec/v1\n"
        b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
        b"size 268435456\n"
    )
    path = tmp_path / "4611686018427387904"
    path.write_bytes(pointer)
    with pytest.raises(DataError) as raised:
        load_slice(path, None)
    message = str(raised.value)
    assert message.startswith(f"data slice {path.name} is a Git LFS pointer ({len(pointer)} bytes")
    assert "cloned without its LFS files" in message and "`git lfs pull`" in message
    assert "\n" not in message
