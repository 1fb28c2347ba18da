"""The safetensors layout reader against safetensors' own writer, for every dtype it writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hypha.accelerate_executor.training.data import load_slice
from hypha.accelerate_executor.training.tensorfile import DTYPE_CODES, DTYPES

WRITTEN_BY_SAFETENSORS = [
    "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
    "F8_E4M3", "F8_E5M2", "C64",
]  # fmt: skip


def test_the_unsigned_and_fp8_dtypes_are_known() -> None:
    assert {"F8_E4M3", "F8_E5M2", "U16", "U32", "U64"} <= DTYPES.keys()
    assert all(DTYPES[code] is dtype for dtype, code in DTYPE_CODES.items())


@pytest.mark.parametrize("code", WRITTEN_BY_SAFETENSORS)
def test_every_dtype_reads_back_what_safetensors_wrote(tmp_path: Path, code: str) -> None:
    dtype = DTYPES[code]
    values = torch.arange(12, dtype=torch.float64).reshape(3, 4).to(dtype)
    save_file({"t": values, "n": torch.arange(3)}, tmp_path / "slice")
    read = load_slice(tmp_path / "slice", ["t"])["t"]
    assert read.dtype == dtype and read.shape == (3, 4)
    assert torch.equal(read.view(torch.uint8), values.contiguous().view(torch.uint8))
