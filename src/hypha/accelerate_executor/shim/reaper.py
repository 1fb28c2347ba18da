"""Containers whose shim died: labelled with the shim's identity, removed by the next shim.

A shim killed with SIGKILL cannot remove its container (its watchdog normally does); if the
watchdog died too, the next shim started on the same host removes what is left.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from hypha.accelerate_executor.shim.container_spec import (
    LABEL_SHIM_HOST,
    LABEL_SHIM_PID,
    LABEL_SHIM_START,
)
from hypha.accelerate_executor.shim.engine import remove_container

if TYPE_CHECKING:
    from docker import APIClient


def process_start(pid: int) -> str | None:
    """'<boot id>:<start time in ticks>' of a live process, so that a pid reused by another
    process (or after a reboot) does not pass for the shim. '' where there is no /proc
    (macOS), None when the process does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # Field 22; the command name (field 2) may hold spaces and parentheses.
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()}:{int(fields[19])}"
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except ProcessLookupError:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


def shim_labels() -> dict[str, str]:
    pid = os.getpid()
    return {
        LABEL_SHIM_HOST: socket.gethostname(),
        LABEL_SHIM_PID: str(pid),
        LABEL_SHIM_START: process_start(pid) or "",
    }


def shim_alive(labels: dict[str, str]) -> bool:
    try:
        pid = int(labels.get(LABEL_SHIM_PID, ""))
    except ValueError:
        return False
    started = process_start(pid)
    return started is not None and started == labels.get(LABEL_SHIM_START, "")


def reap_stale(api: APIClient) -> list[str]:
    """Removes containers started by a shim on this host that no longer runs; returns their
    ids. A shim in its own container has its own hostname and pid namespace, so the host
    label keeps shims from judging pids they cannot see."""
    stale = []
    host_filter = f"{LABEL_SHIM_HOST}={socket.gethostname()}"
    for container in api.containers(all=True, filters={"label": host_filter}):
        if not shim_alive(container.get("Labels") or {}):
            remove_container(api, container["Id"])
            stale.append(container["Id"])
    return stale
