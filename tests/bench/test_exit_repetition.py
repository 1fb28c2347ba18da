"""bench/exit_repetition.py works: one run of each path, counted, and its counting of the lines
a rank that died on a signal leaves. The repetition itself is the script's job, not a test's:
an abort that comes once in dozens of runs says nothing in one."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "exit_repetition.py"


def exit_repetition() -> ModuleType:
    spec = importlib.util.spec_from_file_location("exit_repetition", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["exit_repetition"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_lines_of_a_rank_that_aborted_are_counted() -> None:
    output = "\n".join(
        [
            "[w1] round 2: done",
            "terminate called without an active exception",
            "E1126 ... api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 26292) of binary: python",
            "  exitcode  : -6 (pid: 26292)",
            "[w1] job 3: exit code 0 is not an abort, nor is a loss of -6.2",
        ]
    )
    assert exit_repetition().abort_lines(output) == output.splitlines()[1:4]


def repeat_once(paths: str, out: Path) -> dict[str, dict]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", "--paths", paths, "--out", str(out)],
        capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert list(results["paths"]) == paths.split(",")
    for path, tally in results["paths"].items():
        assert path in done.stdout  # the table has its row
        assert tally["runs"] == tally["finished"] == 1, tally
        assert tally["nonzero_exits"] == tally["abort_lines"] == tally["hung"] == 0, tally
        assert tally["exit_codes"] == {"0": 1}, tally
    return dict(results["paths"])


@pytest.mark.slow
def test_one_run_of_each_path_without_docker_is_clean(tmp_path: Path) -> None:
    repeat_once("native,fsdp2,zero2,race", tmp_path)


@pytest.mark.slow
@pytest.mark.docker
def test_one_run_in_the_cpu_image_is_clean(cpu_image: str, tmp_path: Path) -> None:
    repeat_once("image", tmp_path)
