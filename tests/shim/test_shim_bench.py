"""bench/shim_bench.py runs end to end (one repeat; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "shim_bench.py"


@pytest.mark.docker
@pytest.mark.slow
def test_shim_bench_prints_its_table(fake_image: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split()[0] for line in done.stdout.splitlines()[2:]]
    assert rows == ["created", "started", "first", "exited", "peak"]
