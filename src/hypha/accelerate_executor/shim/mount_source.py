"""A path's place on the Docker engine's host (the work dir's, the compile cache's), for a
shim that runs in a container.

Bind-mount sources are read on the engine's host. When the shim runs in a container with
the engine's socket mounted (Compose, docker-out-of-docker), WORK_DIR is a path in the
shim's container; the source must be the host path of the mount that holds it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.errors import DockerError

if TYPE_CHECKING:
    from docker import APIClient

_CONTAINER_ID = re.compile(r"\b([0-9a-f]{64})\b")


def in_container() -> bool:
    return os.path.exists("/.dockerenv")


def own_container_id() -> str:
    """This container's id: from the engine-managed files bind-mounted into it
    (/etc/hostname lives in /var/lib/docker/containers/<id>/), else from the cgroup path
    (cgroup v1), else the hostname, which Docker sets to the short id unless told otherwise."""
    for path, pattern in (
        ("/proc/self/mountinfo", re.compile(r"/containers/([0-9a-f]{64})/")),
        ("/proc/self/cgroup", _CONTAINER_ID),
    ):
        try:
            with open(path) as file:
                match = pattern.search(file.read())
        except OSError:
            continue
        if match:
            return match.group(1)
    return socket.gethostname()


def _contains(parent: str, path: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def translate(work_dir: str, mounts: Iterable[Mapping[str, Any]], what: str = "work dir") -> str:
    """The host path of `work_dir` (or of another path, `what`), through the innermost mount
    whose destination holds it."""
    holding = [m for m in mounts if _contains(str(m.get("Destination", "")), work_dir)]
    if not holding:
        raise DockerError(
            f"{what} {work_dir} is on no mount of the shim's container, so no other container "
            f"can see it; bind-mount the {what}'s base into the shim's container",
        )
    mount = max(holding, key=lambda m: len(str(m["Destination"])))
    shareable = mount.get("Type") == "bind" or (
        mount.get("Type") == "volume" and mount.get("Driver", "local") == "local"
    )
    if not shareable or not mount.get("Source"):
        raise DockerError(
            f"{what} {work_dir} is on a {mount.get('Type')} mount of the shim's container, "
            f"which another container cannot mount; use a bind mount for the {what}'s base",
        )
    rest = work_dir[len(str(mount["Destination"]).rstrip("/")) :]
    return str(mount["Source"]).rstrip("/") + rest


def host_path(api: APIClient, work_dir: str, what: str = "work dir") -> str:
    if not in_container():
        return work_dir
    from docker.errors import NotFound

    try:
        mounts = api.inspect_container(own_container_id()).get("Mounts") or []
    except NotFound:
        # An engine that does not know this container (a Docker-in-Docker sidecar) shares
        # its paths through its own mounts: the path is the same on both sides.
        return work_dir
    return translate(work_dir, mounts, what)
