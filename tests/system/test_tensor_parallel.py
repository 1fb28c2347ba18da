"""Tensor parallelism and TP x FSDP2 train as DDP does, through the project's launcher.

The stand-in's llama job (a tiny Llama: its class ships a tensor-parallel plan), one worker,
the action protocol (every round trains exactly its batches, so the losses compare closely),
3 rounds, fp32, on the CPU over gloo: multi-cpu (DDP, 2 processes), tp.yaml (2) and
tp-fsdp.yaml (4, as 2 x 2). accelerate's GPU-only gates are lifted in every process the
launcher starts, as a GPU host lifts them (sharding/gpu_gates_lifted/sitecustomize.py on
PYTHONPATH); nothing of the product changes. The parameter server must receive from the
sharded workers exactly what DDP sends (names, full shapes, dtypes), the losses must agree
within 1 %, and the model each one keeps must be DDP's.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from cpu_configs import cpu_config
from hypha.accelerate_executor.training.parallelism import two_dimensional_verified
from hypha.standin.coordinator.server import RunOptions
from hypha.standin.data_service.assets import LlamaSpec, ensure_assets
from hypha.standin.demo import run_demo
from hypha.standin.worker.worker import ExecutorEntry
from repo_paths import TESTS

pytestmark = pytest.mark.slow
BRIDGE_ARGS = ("--socket", "{SOCKET_PATH}", "--work-dir", "{WORK_DIR}", "--job", "{JOB_JSON}")
GATES_LIFTED = TESTS / "sharding" / "gpu_gates_lifted"
TOLERANCE = 0.01
PYTHONPATH = os.environ.get("PYTHONPATH", "")  # kept behind the gates' folder


def entry(config: Path, processes: int, kept: Path, settings: dict[str, str]) -> ExecutorEntry:
    env = [("ACCELERATE_USE_CPU", "True"), ("HYPHA_MODEL_DIR", str(kept)), *settings.items()]
    if "multi-cpu" not in config.name:  # DDP on the CPU is what accelerate runs as it is
        env.append(("PYTHONPATH", os.pathsep.join(filter(None, [str(GATES_LIFTED), PYTHONPATH]))))
    return ExecutorEntry(
        sys.executable,
        ("-m", "hypha.accelerate_executor.platform.launcher", "--accelerate-config",
         str(config), "--num-processes", str(processes), *BRIDGE_ARGS),
        tuple(env),
    )  # fmt: skip


def run(
    name: str,
    processes: int,
    tmp: Path,
    work_base: Path,
    assets: Path,
    settings: dict[str, str] | None = None,
    **options: Any,
) -> tuple[dict[str, Any], Path]:
    """One run of the llama job under the bundled config `name`, the executor given the
    HYPHA_* `settings`: its summary, and the folder its workers keep their final models in."""
    out = tmp / name
    out.mkdir()
    kept = out / "kept"
    run_options = RunOptions(
        **{"workers": 1, "rounds": 3, "steps_per_round": 10, "job": "llama", **options}
    )
    executor = entry(cpu_config(name, out), processes, kept, settings or {})
    run_demo(run_options, executor, out_dir=out / "out",
             work_base=work_base, assets_dir=assets, timeout_s=600)  # fmt: skip
    return json.loads((out / "out" / "summary.json").read_text()), kept


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("assets")
    ensure_assets(folder, LlamaSpec())
    return folder


def test_tensor_parallel_and_2d_send_and_keep_what_ddp_does(
    tmp_path: Path, short_tmp: Path, assets: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Under TP the speculative step always runs a batch ahead; under TP x FSDP2 each share
    # of 4 samples goes in micro-batches of 2: neither may change what is trained.
    runs = {
        name: run(name, processes, tmp_path, short_tmp, assets, settings)
        for name, processes, settings in (
            ("multi-cpu", 2, {}),
            ("tp", 2, {"HYPHA_SPECULATIVE_STEP": "on"}),
            ("tp-fsdp", 4, {"HYPHA_MICRO_BATCH_SIZE": "2"}),
        )
    }
    output = "".join(capfd.readouterr())
    two_d = two_dimensional_verified()
    if not two_d:  # an older torch: refused before training, in one line
        refused, _ = runs.pop("tp-fsdp")
        assert refused["workers"]["w1"]["exit_code"] == 2
        assert "tensor parallelism with FSDP2 beside it needs torch" in output
    ddp, ddp_kept = runs["multi-cpu"]
    for name, (summary, kept) in runs.items():
        assert summary["workers"]["w1"]["exit_code"] == 0, name
        losses = [record["mean_loss"] for record in summary["rounds"]]
        assert len(losses) == 3
        assert losses == pytest.approx([r["mean_loss"] for r in ddp["rounds"]], rel=TOLERANCE)
        # What the parameter server received, round by round: DDP's names, shapes, dtypes.
        layouts = [aggregation["layouts"] for aggregation in summary["aggregations"]]
        assert layouts == [a["layouts"] for a in ddp["aggregations"]], name
        (ddp_model,) = ddp_kept.glob("*/model.safetensors")
        (model,) = kept.glob("*/model.safetensors")
        ddp_weights, weights = load_file(ddp_model), load_file(model)
        assert sorted(weights) == sorted(ddp_weights)
        for tensor_name, tensor in weights.items():
            assert tensor.shape == ddp_weights[tensor_name].shape, (name, tensor_name)
            assert (tensor - ddp_weights[tensor_name]).abs().max() < 1e-3, (name, tensor_name)
    # Rank 0's share of the weights, as each run said it.
    held = [float(x) for x in re.findall(r"rank 0 holds ([0-9.]+) of the weights", output)]
    expected = [0.5, 0.25] if two_d else [0.5]
    assert held == [pytest.approx(share, abs=0.01) for share in expected], held


def test_a_late_joiner_under_tensor_parallelism_gets_the_model_per_block(
    tmp_path: Path, short_tmp: Path, assets: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The first worker writes theta_global from its blocks for the late one, who reads its
    own blocks of it: both tensor parallel over 2 processes."""
    summary, _ = run("tp", 2, tmp_path, short_tmp, assets, late_workers=1, rounds=3)
    output = "".join(capfd.readouterr())
    assert all(worker["exit_code"] == 0 for worker in summary["workers"].values()), summary
    assert "received the model from a peer" in output


def test_a_model_without_a_plan_is_refused_in_one_line(
    tmp_path: Path, short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    summary, _ = run("tp", 2, tmp_path, short_tmp, tmp_path / "gpt2-assets", job="causal-lm")
    output = "".join(capfd.readouterr())
    assert summary["workers"]["w1"]["exit_code"] == 2
    assert "GPT2LMHeadModel has none; shard it with fsdp.yaml" in output
    assert "Traceback" not in output
