"""The benchmarks run end to end at a tiny size, and fail in one line.

No timing is asserted: a 2-core CI machine shared with other jobs measures nothing
useful at this size. What is asserted is that every benchmark produced its rows, the
JSON and the plot, and the facts that do not depend on speed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_every_benchmark_runs_at_smoke_size(tmp_path: Path) -> None:
    done = bench("--smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]

    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert {row["benchmark"] for row in results["rows"]} == {
        "inner loop",
        "data path",
        "sync round",
        "pseudo-gradient",
        "status delay",
        "short rounds",
        "step overhead",
    }
    for row in results["rows"]:
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, row
        assert row["verdict"] in ("met", "GAP", "-")
        assert row["case"] in done.stdout  # the table shows every row
    assert results["size"] == "smoke"
    assert (tmp_path / "performance.png").read_bytes().startswith(b"\x89PNG")
    others = results["cpu_share_of_other_processes"]
    assert len(others) == 9 and all(share >= 0 for share in others.values())

    [inner] = results["inner_loop"]
    assert len(inner["executor_rounds"]) == 1 and inner["executor_samples_per_s"] > 0
    assert [len(rounds) for rounds in inner["bare_rounds"]] == [1, 1]
    assert all(rate > 0 for rate in inner["bare_samples_per_s"])
    [sync] = results["sync_round"]
    assert sync["dtype"] == "float32"
    assert set(sync["parts_s"]) == {"write", "send", "merge", "load", "report"}
    assert sync["bytes_out"] >= 4 * sync["parameters"]  # fp32: 4 bytes a parameter

    fp32, bf16 = results["pseudo_gradient"]
    assert (fp32["dtype"], bf16["dtype"]) == ("float32", "bfloat16")
    # bf16 halves the tensor bytes; the safetensors header is the same size either way.
    assert 0.45 < bf16["bytes_per_round"] / fp32["bytes_per_round"] < 0.55
    for run in (fp32, bf16):
        assert math.isfinite(run["final_loss"])
        assert (tmp_path / f"demo-{run['dtype']}" / "summary.json").is_file()

    delays = results["status_delay"]
    assert [run["delay_ms"] for run in delays] == [0, 20, 100]
    assert all(run["median_samples_per_s"] > 0 and run["overshoot"][0] >= 0 for run in delays)

    short, dropout, near_free = results["short_rounds"]
    assert near_free["model"] == "near-free" and near_free["runs"]["0"]["executor"]
    assert dropout["executors"] == ["bare", "bare-eval", "executor"]
    assert all(dropout["runs"]["0"][name] for name in dropout["executors"])
    assert short["executors"] == ["bare", "executor"] and short["delays_ms"] == [0]
    for name in ("bare", "executor"):
        [run] = short["runs"]["0"][name]
        assert run["samples_per_s"] > 0 and run["cpu_ms_per_batch"] > 0
        # Both split the round the same way, from the coordinator's records and their own line.
        assert {"reload", "first step", "training", "waiting"} <= set(run["split_s"])
        assert {"step", "data", "statuses", "cpu"} <= set(run["timing"])
    [overhead] = results["step_overhead"]
    assert overhead["bare_us"] > 0 and overhead["executor_us"] > 0
    assert overhead["adamw_default_us"] > 0 and overhead["adamw_fused_us"] > 0


@pytest.mark.slow
def test_inner_loop_in_bf16_runs_both_loops_in_bf16(tmp_path: Path) -> None:
    done = bench("--smoke", "--only", "inner", "--mixed-precision", "bf16", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    [inner] = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))["inner_loop"]
    assert inner["mixed_precision"] == "bf16" and inner["device"] == "cpu"
    assert "mixed precision bf16" in done.stderr  # the executor's own job line
    assert ", bf16 on cpu" in done.stdout


def test_unknown_benchmark_is_refused_in_one_line(tmp_path: Path) -> None:
    done = bench("--only", "inner,warp-drive", "--out", str(tmp_path), timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "warp-drive" in done.stderr


def test_unusable_out_folder_fails_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    done = bench("--only", "data", "--out", str(blocker / "results"), timeout=300)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("bench: "), done.stderr


def test_against_needs_a_name_and_a_path(tmp_path: Path) -> None:
    done = bench("--only", "rounds", "--against", "executor=/usr/bin/python3", timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "NAME=PATH" in done.stderr


def test_retry_overhead_compares_the_wrapper_with_a_plain_call() -> None:
    script = RUN.with_name("retry_overhead.py")
    done = subprocess.run(
        [sys.executable, str(script), "--requests", "20", "--repeats", "1"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "with the retry wrapper" in done.stdout and "ratio" in done.stdout
