"""bench/clock_skew.py runs end to end at its smoke size (1 round, no skew and 70 s ahead) and
prints its table. No timing is asserted: a run of 3 batches measures nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "clock_skew.py"


@pytest.mark.slow
def test_the_clock_skew_bench_runs_at_smoke_size() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("clock skew: 2 workers x 1 rounds of 48 samples, causal-lm job")
    assert re.fullmatch(
        r"\| 70 s ahead \| 0/0 \| yes \| 1 of 1 \| 1/1 \| [\d.]+ \| [\d.]+ \|", lines[3]
    ), lines
    assert re.fullmatch(r"worst [\d.]+x \(target <= 1.1x: (met|GAP)\)", lines[4]), lines
