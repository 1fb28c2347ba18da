"""The demo end to end: coordinator, workers, real executor processes, report and verdict.

The executor here is tests/local/toy_executor.py, so the stand-in is proven without the
project's executor; tests/test_end_to_end.py runs the real one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hypha.accelerate_executor.local import cli
from hypha.accelerate_executor.local.coordinator import RunOptions
from hypha.accelerate_executor.local.demo import run_demo
from hypha.accelerate_executor.local.worker import EXECUTOR_ARGS, ExecutorEntry

TOY = ExecutorEntry(
    sys.executable, (str(Path(__file__).with_name("toy_executor.py")), *EXECUTOR_ARGS)
)


@pytest.mark.slow
def test_demo_trains_two_workers_and_writes_the_report(assets_dir, short_dir, tmp_path, capsys):
    out = tmp_path / "out"
    options = RunOptions(workers=2, rounds=3, steps_per_round=20, lr_schedule="constant")
    code = run_demo(
        options, TOY, out_dir=out, work_base=short_dir, assets_dir=assets_dir, timeout_s=300
    )
    output = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, summary["reasons"]
    assert summary["passed"] and summary["loss_ratio"] <= 0.6
    assert (out / "loss.png").stat().st_size > 10_000
    assert [entry["round"] for entry in summary["rounds"]] == [0, 1, 2]
    assert len(summary["aggregations"]) == 3
    for name in ("w1", "w2"):
        worker = summary["workers"][name]
        assert worker["exit_code"] == 0 and worker["violations"] == [] and worker["leaks"] == []
        assert worker["rounds_completed"] == 3
        assert [round_["batches"] for round_ in worker["rounds"]] == [20, 20, 20]
        assert worker["samples_per_s"] > 0
        assert worker["final_loss"] < worker["first_loss"]
        assert f"[{name}] round 2: loss" in output
    # Distinct slices across the two workers.
    slices = summary["workers"]["w1"]["slices"] + summary["workers"]["w2"]["slices"]
    assert len(slices) == len(set(slices))
    assert "[coordinator] round 2: loss w1" in output
    assert list(short_dir.iterdir()) == []


@pytest.mark.slow
def test_demo_fails_when_an_executor_fails(assets_dir, short_dir, tmp_path, capsys):
    broken = ExecutorEntry(sys.executable, ("-c", "import sys; print('giving up'); sys.exit(5)"))
    out = tmp_path / "out"
    code = run_demo(
        RunOptions(workers=2, rounds=1),
        broken,
        out_dir=out,
        work_base=short_dir,
        assets_dir=assets_dir,
        timeout_s=120,
    )
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["passed"]
    assert "w1's executor exited with 5" in summary["reasons"]
    assert "FAILED" in capsys.readouterr().out


def test_cli_refuses_bad_arguments_in_one_line(capsys):
    assert cli.main(["demo", "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip() == "hypha-accelerate local: workers must be at least 1"
    assert cli.main(["demo", "--executor", "toml:/nonexistent.toml"]) == 2
    assert "cannot read worker config /nonexistent.toml" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["worker", "--coordinator", "http://127.0.0.1:1"])
    assert exit_.value.code == 2


def test_demo_cancels_at_its_timeout(assets_dir, short_dir, tmp_path):
    stuck = ExecutorEntry(
        sys.executable,
        (
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); time.sleep(120)",
        ),
    )
    out = tmp_path / "out"
    code = run_demo(
        RunOptions(workers=2),
        stuck,
        out_dir=out,
        work_base=short_dir,
        assets_dir=assets_dir,
        timeout_s=2,
    )
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cancelled"] == "timed out after 2 s"
    assert [worker["exit_code"] for worker in summary["workers"].values()] == [143, 143]
    assert list(short_dir.iterdir()) == []
