"""The safetensors file format, tensor by tensor, so that a sync round can stream model-sized
files through a small buffer instead of materialising them in memory.

A file is: 8 bytes of little-endian header length N, N bytes of JSON header (padded with
spaces so the data starts 8-byte aligned), then the tensors' bytes back to back. The header
maps each name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets counted from the
start of the data; an optional "__metadata__" entry holds strings. Files written here are
read by any safetensors reader, and any safetensors file is read here.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import BinaryIO, TypeGuard

import torch

from hypha.accelerate_executor.errors import TensorFileError

_CODES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}
# Every safetensors dtype that this torch has (older releases lack the unsigned and fp8 ones).
DTYPE_CODES = {getattr(torch, name): code for code, name in _CODES.items() if hasattr(torch, name)}
DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
# A header this large would be a corrupt length field, not a model's worth of names.
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def layout(
    tensors: list[tuple[str, torch.dtype, tuple[int, ...]]],
    metadata: dict[str, str] | None = None,
) -> tuple[bytes, list[TensorEntry]]:
    """The header bytes (length prefix included) for tensors stored in this order, and where
    each one's bytes go; `metadata` becomes the "__metadata__" entry."""
    entries, begin = [], 0
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    for name, dtype, shape in tensors:
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": DTYPE_CODES[dtype],
            "shape": list(shape),
            "data_offsets": [begin, begin + nbytes],
        }
        entries.append((name, dtype, shape, begin, nbytes))
        begin += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    prefix = struct.pack("<Q", len(text)) + text
    return prefix, [
        TensorEntry(name, dtype, shape, len(prefix) + start, nbytes)
        for name, dtype, shape, start, nbytes in entries
    ]


def read_layout(file: BinaryIO, size: int) -> list[TensorEntry]:
    """The entries of an open safetensors file of `size` bytes, checked against its size."""
    name = getattr(file, "name", "the file")
    prefix = file.read(8)
    if len(prefix) < 8:
        raise TensorFileError(f"{name} is too short to be a safetensors file")
    (header_bytes,) = struct.unpack("<Q", prefix)
    if header_bytes > min(size - 8, MAX_HEADER_BYTES):
        raise TensorFileError(f"{name}: header length {header_bytes} does not fit the file")
    try:
        header = json.loads(file.read(header_bytes))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorFileError(f"{name}: the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{name}: the header is not a JSON object")
    data_start = 8 + header_bytes
    entries = []
    for tensor_name, info in header.items():
        if tensor_name == "__metadata__":
            continue
        entries.append(_entry(name, tensor_name, info, data_start, size))
    return entries


def _entry(file_name: str, name: str, info: object, data_start: int, size: int) -> TensorEntry:
    if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
        raise TensorFileError(f"{file_name}: tensor {name!r} has a malformed or unknown dtype")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (_naturals(shape) and _naturals(offsets) and len(offsets) == 2):
        raise TensorFileError(f"{file_name}: tensor {name!r} has a malformed shape or offsets")
    dtype = DTYPES[info["dtype"]]
    nbytes = math.prod(shape) * dtype.itemsize
    begin, end = offsets
    if end - begin != nbytes or data_start + end > size:
        raise TensorFileError(f"{file_name}: tensor {name!r} has offsets that do not fit")
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, nbytes)


def _naturals(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(type(n) is int and n >= 0 for n in value)
