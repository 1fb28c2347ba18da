"""What the launcher will run for one job: the processes, the command, the environment,
and how it reads to a human."""

from __future__ import annotations

import argparse
import math
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.errors import LaunchError
from hypha.accelerate_executor.platform.launcher.configs import (
    configs_dir,
    read_config,
    resolve_config,
)
from hypha.accelerate_executor.platform.launcher.discovery import count_gpus, image_variant

TRAINING_MODULE = "hypha.accelerate_executor.training"


@dataclass(frozen=True)
class Plan:
    """What the launcher will run, for one job."""

    variant: str
    gpus: int
    config_path: Path
    how_chosen: str
    num_processes: int
    distributed_type: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def direct(self) -> bool:
        return self.command[1:3] == ["-m", TRAINING_MODULE]


def free_port() -> int:
    """A free loopback port for the ranks' rendezvous, so that containers sharing the host
    network (or several jobs on one host) do not collide on accelerate's fixed 29500."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plan(
    args: argparse.Namespace,
    env: Mapping[str, str],
    dev: Path = Path("/dev"),
    sys_root: Path = Path("/sys"),
) -> Plan:
    variant = image_variant(env, dev)
    gpus = count_gpus(variant, env, dev, sys_root)
    path, how = resolve_config(
        args.accelerate_config, variant, gpus, args.num_processes, configs_dir(env)
    )
    config = read_config(path)
    distributed = str(config["distributed_type"])
    if distributed == "NO":
        processes = args.num_processes or 1
        if processes != 1:
            raise LaunchError(
                f"accelerate config {path.name} runs one process (distributed_type NO), "
                f"not {processes}; choose multi-gpu or multi-cpu"
            )
    elif args.num_processes:
        processes = args.num_processes
    elif distributed == "MULTI_CPU" or config.get("use_cpu"):
        processes = int(config.get("num_processes") or 1)
    elif gpus == 0:
        raise LaunchError(
            f"accelerate config {path.name} ({distributed}) needs GPUs and this container sees none; "
            "pass --num-processes to override"
        )
    else:
        processes = gpus

    training_args = [
        "-m", TRAINING_MODULE,
        "--socket", args.socket or "{SOCKET_PATH}",
        "--work-dir", args.work_dir or "{WORK_DIR}",
    ]  # fmt: skip
    # Without --job the ranks read JOB_JSON from the environment they inherit: nothing
    # secret on any command line.
    if args.job:
        training_args += ["--job", args.job]
    extra_env: dict[str, str] = {}
    if distributed == "NO":
        # What `accelerate launch` exports for one process, without its start-up cost.
        dynamo = (config.get("dynamo_config") or {}).get("dynamo_backend", "no")
        extra_env = {
            "ACCELERATE_USE_CPU": str(bool(config.get("use_cpu"))),
            "ACCELERATE_MIXED_PRECISION": str(config.get("mixed_precision") or "no").lower(),
            "ACCELERATE_DYNAMO_BACKEND": str(dynamo).upper(),
        }
        command = [sys.executable, *training_args]
    else:
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(path),
            "--num_processes", str(processes),
            "--main_process_port", str(free_port()),
        ]  # fmt: skip
        command += parallelism_arguments(config, processes, path.name)
        if distributed == "MULTI_CPU":
            # accelerate runs MULTI_CPU through mpirun, which the image lacks; its torchrun
            # path starts the ranks, and this variable puts each of them on the CPU.
            command.append("--multi_gpu")
            extra_env["ACCELERATE_USE_CPU"] = "True"
        command += training_args
    return Plan(variant, gpus, path, how, processes, distributed, command, extra_env)


def parallelism_arguments(config: dict[str, Any], processes: int, name: str) -> list[str]:
    """`accelerate launch` flags that fit a config's `parallelism_config` block to the
    processes started: tensor parallelism alone spans them all; with FSDP2 beside it the
    tp_size stays and dp_shard_size takes the rest. Nothing when the block already fits."""
    block = config.get("parallelism_config") or {}
    sizes = {
        key: int(block.get(f"parallelism_config_{key}_size") or 1)
        for key in ("dp_replicate", "dp_shard", "tp", "cp")
    }
    if not block or math.prod(sizes.values()) == processes:
        return []
    if sizes["tp"] > 1 and sizes["dp_shard"] == sizes["dp_replicate"] == sizes["cp"] == 1:
        return ["--parallelism_config_tp_size", str(processes)]
    rest = sizes["tp"] * sizes["dp_replicate"] * sizes["cp"]
    if sizes["dp_shard"] > 1 and processes % rest == 0:
        return ["--parallelism_config_dp_shard_size", str(processes // rest)]
    raise LaunchError(
        f"accelerate config {name}'s parallelism_config ({', '.join(f'{k} {v}' for k, v in sizes.items())})"
        f" does not fit {processes} processes; its sizes must multiply to the process count"
    )


def redacted(command: Sequence[str]) -> str:
    """The command line for humans: the job JSON may carry tokens, so only its size shows."""
    shown: list[str] = []
    for i, arg in enumerate(command):
        if i > 0 and command[i - 1] == "--job" and not arg.startswith("@") and arg != "{JOB_JSON}":
            arg = f"<job JSON, {len(arg.encode())} bytes>"
        shown.append(arg if arg and " " not in arg else repr(arg))
    return " ".join(shown)


def describe(p: Plan) -> str:
    lines = [
        f"variant: {p.variant}",
        f"gpus visible: {p.gpus}",
        f"accelerate config: {p.config_path} ({p.how_chosen})",
        f"distributed type: {p.distributed_type}",
        f"num processes: {p.num_processes}",
        "launch: "
        + ("training module directly (one process)" if p.direct else "accelerate launch"),
        "env: " + (" ".join(f"{k}={v}" for k, v in p.env.items()) or "-"),
        f"command: {redacted(p.command)}",
        f"--- {p.config_path.name}",
        p.config_path.read_text().rstrip(),
    ]
    return "\n".join(lines)
