"""The worker's batch shared by two processes (DDP over gloo, under the real launcher): the
step's gradient is the mean over the whole batch although the shares differ. The checks
are in sharding/batch_share_check.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from hypha.accelerate_executor.platform.launcher.plan import free_port
from repo_paths import REPO, TESTS

REPO = REPO
CHECK = TESTS / "sharding" / "batch_share_check.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("micro", [0, 2])
def test_unequal_shares_give_the_whole_batch_gradient(micro: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch",
         "--config_file", str(REPO / "accelerate-configs" / "multi-cpu.yaml"),
         "--num_processes", "2", "--main_process_port", str(free_port()), "--multi_gpu",
         str(CHECK), str(micro)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ACCELERATE_USE_CPU": "True"},  # the launcher's own way on the CPU
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert sorted(re.findall(r"ok (\d)", result.stdout)) == ["0", "1"]
