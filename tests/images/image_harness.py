"""Helpers for the image tests: the console command, hardened `docker run`, image lookup."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypha.accelerate_executor import __version__

ROOT = Path(__file__).resolve().parents[2]
CPU_IMAGE = f"hypha-accelerate-executor:{__version__}-cpu"
# The hardening every production run uses; the image must work under all of it.
HARDENED = (
    "--read-only",
    "--tmpfs",
    "/tmp",
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
)
ARBITRARY_USER = "4321:4321"


def hypha_accelerate(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """The console command, from this interpreter's environment."""
    return subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def docker_run(
    image: str, *args: str, options: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`docker run --rm` as an arbitrary non-root uid with the production hardening."""
    return subprocess.run(
        ["docker", "run", "--rm", "--user", ARBITRARY_USER, *HARDENED, *options, image, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def image_exists(api: Any, name: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        api.inspect_image(name)
    except ImageNotFound:
        return False
    return True
