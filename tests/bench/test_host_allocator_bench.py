"""bench/host_allocator.py runs end to end at its smoke size, both sides with the same losses
and the threshold named (no figure is asserted: at that size the step's tensors
are a few MB of a process's 400)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO

BENCH = REPO / "bench" / "host_allocator.py"


@pytest.mark.slow
def test_both_sides_are_measured_and_train_alike(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(figures)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ratio held/default" in done.stdout and "losses identical" in done.stdout
    result = json.loads(figures.read_text(encoding="utf-8"))
    assert result["threshold"] == "MALLOC_MMAP_THRESHOLD_=131072"
    for side in result["sides"].values():
        assert side["peak_bytes"] >= side["before_steps_bytes"] > 0
