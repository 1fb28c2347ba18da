"""What checking a fetched data slice whole costs (training/data.py, SliceStream._fetch_slice).

Each slice is read once more on the fetching thread before training takes it, so that one a
broken download left truncated in the bridge's cache is fetched again instead of ending the
job (docs/faults.md). A slice like the stand-in's GPT-2 slices (2048 samples x 1024 tokens,
int64 ids and mask, 32 MiB raw), plain (alpha.17) and as a raw Snappy block (action era):
printed, the milliseconds one check takes, the best of 10.

    python bench/slice_check.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import cramjam
import torch
from safetensors.torch import save

from hypha.accelerate_executor.training.data import _read_slice

TRIES = 10


def main() -> None:
    ids = torch.randint(0, 50_000, (2048, 1024), dtype=torch.int64)
    plain = save({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    forms = {"plain": plain, "snappy": bytes(cramjam.snappy.compress_raw(plain))}
    with tempfile.TemporaryDirectory() as directory:
        for name, data in forms.items():
            path = Path(directory) / name
            path.write_bytes(data)
            times = []
            for _ in range(TRIES):
                started = time.perf_counter()
                _read_slice(path)
                times.append(time.perf_counter() - started)
            print(
                f"{name}: {len(data) / 2**20:.1f} MiB on disk, {len(plain) / 2**20:.0f} MiB raw: "
                f"{min(times) * 1000:.1f} ms per check (best of {TRIES})"
            )


if __name__ == "__main__":
    main()
