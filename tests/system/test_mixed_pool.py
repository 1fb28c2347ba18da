"""A pool of different executors, as on a real network: this executor beside a command of
the operator's own (a worker TOML's entry), against the stand-in's parameter server, which
adds only tensors of one name, shape and dtype, as upstream's does (`apply_tensor_op`).

The own command is this executor told to send bfloat16, as upstream's accelerate executor
casts its pseudo-gradients (its utils.py `extract_gradients`). With no setting, ours sends
bfloat16 on the action protocol too: every aggregate holds every tensor and the loss falls.
With float32 forced on ours, no tensor agrees, the global model never moves, and ours says
so in its first round."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hypha.standin.coordinator.server import RunOptions
from hypha.standin.demo import run_demo
from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, executor_entry

pytestmark = pytest.mark.slow
ROUNDS = 3


def own_entry(folder: Path, *flags: str) -> str:
    """`toml:PATH` of a worker TOML whose train entry runs this executor with `flags`."""
    args = ["-m", "hypha.accelerate_executor.training", *flags, *EXECUTOR_ARGS]
    path = folder / "worker.toml"
    path.write_text(
        '[[executors]]\nclass = "train"\nname = "own"\nruntime = "process"\n'
        f"cmd = {json.dumps(sys.executable)}\nargs = {json.dumps(args)}\n",
        encoding="utf-8",
    )
    return f"toml:{path}"


def run_pool(tmp: Path, short: Path, ours: str, theirs: str) -> dict:
    pool = [executor_entry(spec) for spec in (ours, theirs)]
    options = RunOptions(workers=2, rounds=ROUNDS, steps_per_round=20, generation="actions")
    run_demo(options, pool, out_dir=tmp / "out", work_base=short, timeout_s=600)
    return json.loads((tmp / "out" / "summary.json").read_text())


def test_a_pool_with_a_bfloat16_sender_aggregates_every_tensor(
    tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = own_entry(tmp_path, "--pseudo-gradient-dtype", "bfloat16")
    summary = run_pool(tmp_path, short_tmp, "process", theirs)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert summary["passed"], summary["reasons"]
    assert "executors: " in out and "update held" not in out and "left out" not in out
    aggregations = summary["aggregations"]
    assert len(aggregations) == ROUNDS
    assert all(a["skipped_tensors"] == [] for a in aggregations)


def test_float32_beside_bfloat16_is_said_in_the_first_round(
    tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = own_entry(tmp_path, "--pseudo-gradient-dtype", "float32")
    summary = run_pool(tmp_path, short_tmp, ours, "process")
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "(dtypes differ)" in out
    first = next(line for line in out.splitlines() if "[w1]" in line and "update held" in line)
    assert "round 1's update held 0 of" in first, first
    assert all(a["skipped_tensors"] for a in summary["aggregations"])
