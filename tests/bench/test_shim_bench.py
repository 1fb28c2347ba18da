"""bench/shim_bench.py runs end to end (one repeat; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from repo_paths import REPO

BENCH = REPO / "bench" / "shim_bench.py"


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
