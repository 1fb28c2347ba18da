"""The checks before any rank starts: the host driver runs the image, torch can use the
GPUs handed in, HOME is writable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hypha.accelerate_executor.errors import LaunchError
from hypha.accelerate_executor.platform.gpus import describe as describe_verdict
from hypha.accelerate_executor.platform.gpus import nvidia_nodes, read_driver, verdict
from hypha.accelerate_executor.platform.variants import BY_NAME


def check_driver(variant: str, gpus: int, env: Mapping[str, str], dev: Path = Path("/dev")) -> str:
    """For an NVIDIA image handed GPUs: the line saying how the host's driver runs it. A
    driver too old for it, or none to be found, ends the launch with that line."""
    driver = read_driver(env)
    found = verdict(BY_NAME[variant], driver.version)
    if driver.version is None:
        nodes = ", ".join(str(p) for p in nvidia_nodes(dev)) or f"{gpus} GPU(s)"
        raise LaunchError(
            f"GPUs were handed to the container ({nodes}) but no NVIDIA driver version is "
            f"readable ({driver.source}); the {variant} image "
            f"({BY_NAME[variant].runtime_name()}) needs a driver {found.needs()}: "
            "give it the GPUs through the NVIDIA container toolkit (--gpus)"
        )
    if not found.runs:
        raise LaunchError(describe_verdict(found))
    return f"{describe_verdict(found)} (from {driver.source})"


# Run in a child, so that no CUDA context stays in the launcher while the ranks train.
CUDA_PROBE = """\
import torch
if torch.cuda.is_available() and torch.cuda.device_count() > 0:
    print("ok", torch.cuda.device_count())
else:
    try:
        torch.cuda.init()
        print("unusable: torch.cuda.is_available() is False")
    except Exception as exc:
        print("unusable:", (str(exc).strip().splitlines() or [type(exc).__name__])[-1])
"""


def require_usable_gpus(variant: str, gpus: int, env: Mapping[str, str]) -> None:
    """GPUs were handed in: torch must be able to use them, or the launch ends here."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", CUDA_PROBE],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise LaunchError("asking torch for the GPUs took over 300 s; not starting") from None
    answer = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0 or not answer.startswith("ok"):
        why = (
            answer.removeprefix("unusable: ")
            or (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        )
        raise LaunchError(
            f"{gpus} GPU(s) were handed to the {variant} container but torch cannot use them "
            f"({why}); not training on the CPU instead"
        )


def require_writable_home(env: Mapping[str, str]) -> None:
    """Every cache lives under HOME (/tmp in the image); on a read-only root fs without a
    tmpfs there, the job would fail deep inside a library instead of here."""
    home = env.get("HOME")
    if home and not os.access(home, os.W_OK):
        raise LaunchError(
            f"HOME {home} is not writable: give the container a tmpfs there (--tmpfs {home})"
        )
