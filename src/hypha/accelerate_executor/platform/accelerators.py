"""What each GPU variant needs from the host, checked before a container is created."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hypha.accelerate_executor.errors import DockerError
from hypha.accelerate_executor.platform.gpus import dev_dir, rocm_nodes_present

if TYPE_CHECKING:
    from docker import APIClient

ROCM_DEVICES = ("/dev/kfd", "/dev/dri")


def nvidia_runtime_present(api: APIClient) -> bool:
    # The NVIDIA container toolkit registers this runtime with the engine; without the
    # toolkit a device request fails only at start, with a message about device drivers.
    return "nvidia" in (api.info().get("Runtimes") or {})


def require_nvidia_runtime(api: APIClient, variant: str) -> None:
    if not nvidia_runtime_present(api):
        raise DockerError(
            f"variant {variant} needs the NVIDIA container toolkit, but the Docker engine has no "
            "'nvidia' runtime; install nvidia-container-toolkit and run "
            "`nvidia-ctk runtime configure --runtime=docker`, then restart dockerd",
        )


def rocm_present() -> bool:
    return rocm_nodes_present(dev_dir(os.environ))


def rocm_device_groups() -> list[str]:
    """The numeric groups owning /dev/kfd and the render nodes (video and render on most
    distributions). Numeric, because group names resolve inside the image, which may not
    have a `render` group; gid 0 is left out, it would hand the container root's group."""
    if not rocm_present():
        raise DockerError(
            "variant rocm64 needs the AMD GPU kernel driver: /dev/kfd or /dev/dri is missing "
            "on this host",
        )
    dev = dev_dir(os.environ)
    nodes = [dev / "kfd", *sorted((dev / "dri").glob("renderD*"))]
    return [str(gid) for gid in sorted({os.stat(node).st_gid for node in nodes}) if gid != 0]
