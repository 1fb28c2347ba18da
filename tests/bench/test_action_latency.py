"""bench/action_latency.py runs end to end at its smoke size and prints its lines. No timing
is asserted: one run of 3 batches on a shared 2-core machine measures nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "action_latency.py"


@pytest.mark.slow
def test_the_action_latency_bench_runs_at_smoke_size(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("action latency: GPT-2 micro, batch 8, 3 batches")
    for delay, line in zip((0, 50), lines[1:], strict=True):
        assert re.fullmatch(
            rf"answers {delay} ms late: speculative [\d.]+ samples/s, blocking [\d.]+ "
            r"samples/s, ratio [\d.]+ \(target >= [\d.]+: (met|GAP)\); auto [\d.]+ samples/s, "
            r"[\d.]+ of the better",
            line,
        ), line
    assert (tmp_path / "r.json").is_file()
