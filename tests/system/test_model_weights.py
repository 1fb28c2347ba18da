"""The sync round's weight access on really sharded models, under the real launcher, over
gloo processes on the CPU. DeepSpeed ZeRO-2 gathers to rank 0 (sharding/model_weights_check.py);
FSDP2, tensor parallelism, both at once and ZeRO-3 keep DiLoCo's outer state per block
(sharding/sharded_outer_state_check.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_configs import cpu_config
from hypha.accelerate_executor.platform.launcher.plan import free_port
from hypha.accelerate_executor.training.parallelism import two_dimensional_verified
from repo_paths import REPO, TESTS

REPO = REPO
CHECK = TESTS / "sharding" / "model_weights_check.py"
SHARDED_CHECK = TESTS / "sharding" / "sharded_outer_state_check.py"
pytestmark = pytest.mark.slow


def launch(
    config: Path, processes: int, check: Path, *arguments: str, **env: str
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--num_processes", str(processes), "--main_process_port", str(free_port())]  # fmt: skip
    if "multi-cpu" in config.name:
        command.append("--multi_gpu")  # accelerate's torchrun path; MULTI_CPU would want mpirun
    result = subprocess.run(
        [*command, str(check), *arguments],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


LAYOUTS = [
    ("multi-cpu", 2, "fsdp2", 0.5),
    ("tp", 2, "tp", 0.5),
    *([("tp-fsdp", 4, "tp", 0.25)] if two_dimensional_verified() else []),
    ("deepspeed-zero3", 2, "zero3", 0.5),
]
"""TP x FSDP2 only on a torch the executor runs it on; on an older one the executor refuses it
before training, and test_tensor_parallel.py checks that refusal instead."""


@pytest.mark.parametrize(("config", "processes", "kind", "fraction"), LAYOUTS)
def test_the_outer_state_is_kept_and_written_per_block(
    config: str, processes: int, kind: str, fraction: float, tmp_path: Path
) -> None:
    """FSDP2 by hand over a multi-cpu group; tp.yaml and tp-fsdp.yaml as the executor loads
    the model under them, accelerate's GPU-only gates lifted as a GPU host lifts them; ZeRO-3
    through accelerate.prepare."""
    # DeepSpeed finds the CPU itself; told to use it, accelerate would leave DeepSpeed out.
    on_cpu = {} if kind == "zero3" else {"ACCELERATE_USE_CPU": "True"}
    result = launch(
        cpu_config(config, tmp_path), processes, SHARDED_CHECK, kind, str(tmp_path),
        PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS / "sharding"), os.environ.get("PYTHONPATH")])),
        **on_cpu,
    )  # fmt: skip
    # The ranks share one stdout: their lines may run into each other.
    found = re.findall(r"ok (\d) ([0-9.]+)", result.stdout)
    assert sorted(rank for rank, _ in found) == [str(rank) for rank in range(processes)]
    # Rank 0 holds about 1/N of the weights (a layer norm's few elements are whole on a
    # tensor-parallel rank).
    assert all(float(held) == pytest.approx(fraction, abs=0.01) for _, held in found), found


def test_zero_2_weights_gather_and_load(tmp_path: Path) -> None:
    shipped = (REPO / "accelerate-configs" / "deepspeed-zero2.yaml").read_text()
    # fp32: in bf16 the sharded forward could not be held to the fp32 reference's.
    config = tmp_path / "deepspeed.yaml"
    config.write_text(shipped.replace("mixed_precision: bf16", "mixed_precision: 'no'"))
    result = launch(config, 2, CHECK)
    assert sorted(re.findall(r"ok (\d)", result.stdout)) == ["0", "1"]
