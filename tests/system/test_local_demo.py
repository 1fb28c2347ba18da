"""The demo end to end: coordinator, workers, real executor processes, report and verdict.

The executor here is tests/helpers/toy_executor.py, so the stand-in is proven without the
project's executor; tests/system/test_end_to_end.py runs the real one.
"""

from __future__ import annotations

import json
import sys

import pytest

from hypha.standin import cli
from hypha.standin.coordinator.report import LOSS_RATIO
from hypha.standin.coordinator.server import RunOptions
from hypha.standin.demo import run_demo
from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry, preset
from repo_paths import HELPERS

TOY = ExecutorEntry(sys.executable, (str(HELPERS / "toy_executor.py"), *EXECUTOR_ARGS))


@pytest.mark.slow
def test_demo_trains_two_workers_and_writes_the_report(assets_dir, short_dir, tmp_path, capsys):
    out = tmp_path / "out"
    options = RunOptions(
        workers=2, rounds=3, steps_per_round=20, lr_schedule="constant", generation="alpha17"
    )
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
    workers = [summary["workers"][name] for name in ("w1", "w2")]
    for index, worker in enumerate(workers):
        assert worker["exit_code"] == 0 and worker["violations"] == [] and worker["leaks"] == []
        assert worker["rounds_completed"] == 3
        assert worker["samples_per_s"] > 0
        assert worker["final_loss"] < worker["first_loss"]
        assert f"[w{index + 1}] round 2: loss" in output
        # The scheduler ended every round with a ScheduleUpdate; the toy honours its counter.
        assert all(round_["overshoot"] == 0 for round_ in worker["rounds"])
    # Each round's target (20 batches of 8 per worker) was reached by the two together.
    for index in range(3):
        assert sum(w["rounds"][index]["samples"] for w in workers) >= 2 * 20 * 8
    # 12 slices of 64 samples, 2 x 3 x 160 trained: the data set came round again, and each
    # worker got its own slices back (slice affinity), never the other's.
    assert summary["slice_passes"] >= 1
    assert all(worker["slices_repeated"] > 0 for worker in workers)
    assert not set(workers[0]["slices"]) & set(workers[1]["slices"])
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


@pytest.mark.slow
def test_demo_plays_the_default_hypha_job_with_the_real_executor(
    assets_dir, short_dir, tmp_path, capsys
):
    # Needs the executor's half of the real-jobs work: remote code, the image preprocessor,
    # batches of 600 across 1000-sample slices, slices rewritten in place under it.
    out = tmp_path / "out"
    options = RunOptions.for_job(
        "lenet", workers=2, generation="alpha17"
    )  # 10 rounds: the job's own length
    executor = preset("process", trust_remote_code=True)
    code = run_demo(
        options, executor, out_dir=out, work_base=short_dir, assets_dir=assets_dir, timeout_s=600
    )
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, (summary["reasons"], capsys.readouterr().out[-3000:])
    assert summary["loss_ratio"] <= LOSS_RATIO
    for worker in summary["workers"].values():
        assert (
            worker["violations"] == [] and worker["batches_trained"] == worker["batches_reported"]
        )
        assert worker["slices_repeated"] > 0
        assert all(round_["samples"] % 600 == 0 for round_ in worker["rounds"])
    assert list(short_dir.iterdir()) == []


def test_cli_refuses_bad_arguments_in_one_line(capsys):
    assert cli.main(["demo", "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip() == "hypha-accelerate local: workers must be at least 1"
    assert cli.main(["demo", "--executor", "toml:/nonexistent.toml"]) == 2
    assert "cannot read worker config /nonexistent.toml" in capsys.readouterr().err
    assert cli.main(["worker", "--coordinator", "http://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == (
        "hypha-accelerate local: the following arguments are required: --name (see --help)\n"
    )


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
