"""bench/parallel_memory.py runs end to end at its quick size (the 5M Llama, DDP, DDP with
gradient checkpointing and FSDP2 at 2 ranks) and prints a row of figures per case, and a case
whose accelerate config is missing is skipped in one line. No figure is asserted: on a shared
2-core machine a 5M model's peaks are mostly the libraries', and two rounds of two batches
time nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "parallel_memory.py"
NUMBER = r"\d+\.\d+"


@pytest.mark.slow
def test_the_parallel_memory_bench_runs_at_quick_size(tmp_path: Path) -> None:
    configs = tmp_path / "configs"  # the two the quick run needs: tp.yaml is missing
    configs.mkdir()
    for name in ("multi-cpu.yaml", "fsdp.yaml"):
        shutil.copy(REPO / "accelerate-configs" / name, configs / name)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cases", "ddp,ddp-ckpt,fsdp2,tp",
         "--configs", str(configs), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    for case, ratio in (("ddp", r"1\.00"), ("ddp-ckpt", NUMBER), ("fsdp2", NUMBER)):
        row = rf"\| {case} +\| 2 +\| 5m +\| {NUMBER}/{NUMBER} +\| {ratio} +\| .+ \| {NUMBER} +\| ok +\|"
        assert any(re.fullmatch(row, line) for line in lines), (case, lines)
    assert f"tp: skipped, no tp.yaml in {configs}" in lines, lines
    assert re.search(rf"peaks at {NUMBER} GB after `import torch`", done.stdout), lines
    results = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert [(row["case"], row["status"]) for row in results["rows"]] == [
        ("ddp", "ok"),
        ("ddp-ckpt", "ok"),
        ("fsdp2", "ok"),
    ]
    # The checkpointed case's executor did checkpoint (its own line), the plain one did not.
    logs = {
        case: (tmp_path / "out" / f"{case}-2-5m-this.log").read_text()
        for case in ("ddp", "ddp-ckpt")
    }
    assert "activation checkpointing: " in logs["ddp-ckpt"], logs["ddp-ckpt"][-2000:]
    assert "activation checkpointing: " not in logs["ddp"]
    for row in results["rows"]:
        assert len(row["peaks_gb"]) == 2 and all(peak > 0.1 for peak in row["peaks_gb"]), row
