"""The bundled accelerate configs: each one loads with accelerate's own loader, passes
`accelerate launch`'s validation, and means what its name says."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_multi_gpu_env

CONFIGS = Path(__file__).resolve().parents[2] / "accelerate-configs"

EXPECTED = {
    "cpu": (DistributedType.NO, True, 1),
    "multi-cpu": (DistributedType.MULTI_CPU, True, 2),
    "gpu": (DistributedType.NO, False, 1),
    "multi-gpu": (DistributedType.MULTI_GPU, False, 2),
    "fsdp": (DistributedType.FSDP, False, 2),
    "deepspeed-zero2": (DistributedType.DEEPSPEED, False, 2),
    "deepspeed-zero3": (DistributedType.DEEPSPEED, False, 2),
    "mps": (DistributedType.NO, False, 1),
    "tp": (DistributedType.MULTI_GPU, False, 2),
    "tp-fsdp": (DistributedType.MULTI_GPU, False, 4),
}


def test_the_bundle_is_exactly_the_expected_set() -> None:
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_and_validates_with_accelerate(name: str) -> None:
    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    distributed, use_cpu, processes = EXPECTED[name]
    assert (config.distributed_type, config.use_cpu, config.num_processes) == (
        distributed,
        use_cpu,
        processes,
    )
    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / f"{name}.yaml"), "train.py"]
    )
    _validate_launch_command(args)


def test_fsdp_is_full_shard_with_a_full_state_dict() -> None:
    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / "fsdp.yaml"), "train.py"]
    )
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    # What the ranks see: FSDP2, every layer re-sharded after forward (FULL_SHARD), and a
    # gathered state dict when saving.
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_VERSION"] == "2"
    assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    assert env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
    assert env["FSDP_OFFLOAD_PARAMS"] == "false"


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs_set_their_zero_stage(stage: int) -> None:
    config = load_config_from_file(str(CONFIGS / f"deepspeed-zero{stage}.yaml"))
    assert config.deepspeed_config["zero_stage"] == stage
    assert config.deepspeed_config["offload_optimizer_device"] == "none"


@pytest.mark.parametrize(
    ("name", "sizes"),
    [("tp", {"TP_SIZE": "2"}), ("tp-fsdp", {"TP_SIZE": "2", "DP_SHARD_SIZE": "2"})],
)
def test_tensor_parallel_configs_reach_the_ranks_as_a_parallelism_config(
    name: str, sizes: dict[str, str]
) -> None:
    args = launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / f"{name}.yaml"), "train.py"]
    )
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    # What accelerate's Accelerator reads its ParallelismConfig from on every rank.
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    for size, value in sizes.items():
        assert env[f"PARALLELISM_CONFIG_{size}"] == value
