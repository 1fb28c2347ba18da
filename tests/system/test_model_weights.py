"""The sync round's weight access on really sharded models, under the real launcher, over
two gloo processes on the CPU: FSDP2, DeepSpeed ZeRO-2 and ZeRO-3. The checks are in
sharding/model_weights_check.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hypha.accelerate_executor.platform.launcher.plan import free_port
from repo_paths import REPO, TESTS

REPO = REPO
CHECK = TESTS / "sharding" / "model_weights_check.py"
pytestmark = pytest.mark.slow


def launch(config: Path, processes: int, kind: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--num_processes", str(processes), "--main_process_port", str(free_port())]  # fmt: skip
    if kind == "fsdp2":
        command.append("--multi_gpu")  # accelerate's torchrun path; MULTI_CPU would want mpirun
    result = subprocess.run(
        [*command, str(CHECK), kind],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def test_fsdp2_weights_gather_and_load() -> None:
    result = launch(
        REPO / "accelerate-configs" / "multi-cpu.yaml", 2, "fsdp2", ACCELERATE_USE_CPU="True"
    )
    # The two ranks share one stdout: their lines may run into each other.
    assert sorted(re.findall(r"ok (\d)", result.stdout)) == ["0", "1"]


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_weights_gather_and_load(stage: int, tmp_path: Path) -> None:
    shipped = (REPO / "accelerate-configs" / f"deepspeed-zero{stage}.yaml").read_text()
    # fp32: in bf16 the sharded forward could not be held to the fp32 reference's.
    config = tmp_path / "deepspeed.yaml"
    config.write_text(shipped.replace("mixed_precision: bf16", "mixed_precision: 'no'"))
    result = launch(config, 2, "deepspeed")
    assert sorted(re.findall(r"ok (\d)", result.stdout)) == ["0", "1"]
