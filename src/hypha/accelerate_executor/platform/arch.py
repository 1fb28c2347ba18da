"""CPU architectures in Docker's words (amd64, arm64): this host's, and an image's.

An image of another architecture runs only under QEMU user emulation (binfmt_misc), tens of
times slower and without the host's GPU libraries: the shim refuses it, `worker-config`
and `doctor` pick the image built for this host.
"""

from __future__ import annotations

import platform
from typing import Any

from hypha.accelerate_executor.platform.variants import ARCHES, Arch

# platform.machine() on Linux (uname -m) and macOS -> Docker's name.
MACHINES: dict[str, Arch] = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
}


class UnknownArchitecture(ValueError):
    """A machine name that is neither amd64 nor arm64."""


def arch_of_machine(machine: str) -> Arch:
    try:
        return MACHINES[machine.lower()]
    except KeyError:
        raise UnknownArchitecture(
            f"CPU architecture {machine!r} has no images (built for {', '.join(ARCHES)})"
        ) from None


def host_arch() -> Arch:
    return arch_of_machine(platform.machine())


def image_arch(inspected: dict[str, Any]) -> str:
    """An image's architecture as the engine's inspect states it (may be any string)."""
    return str(inspected.get("Architecture") or "unknown")
