"""A guard process that cleans up after a shim killed with SIGKILL.

The worker SIGKILLs the shim when it outlives the 5 s after SIGTERM, and a SIGKILLed shim
cannot stop what it started: a container keeps running (and, never auto-removed, stays
behind once it exits), a host process group keeps training. The guard is a separate
session, so neither the worker's signals nor a terminal's reach it; it sleeps until its
parent is gone, then force-removes the container or kills the process group. A shim that
ends normally kills its guard first.

    python -m hypha.accelerate_executor.shim.watchdog PARENT_PID container ID
    python -m hypha.accelerate_executor.shim.watchdog PARENT_PID process-group PGID
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time


class Watchdog:
    def __init__(self, kind: str, target: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid()), kind, target],
            stdin=subprocess.DEVNULL,
            # Not the shim's stdout: the worker reads that pipe until every writer closes it.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def disarm(self) -> None:
        self._process.kill()
        self._process.wait()


def guard_container(container_id: str) -> Watchdog:
    return Watchdog("container", container_id)


def guard_process_group(pgid: int) -> Watchdog:
    return Watchdog("process-group", str(pgid))


def wait_for_exit(parent: int) -> None:
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # macOS, or a kernel before 5.3
        while os.getppid() == parent:
            time.sleep(0.5)
        return
    # If the parent died before pidfd_open, this process has been re-parented and the pid
    # may already name another process.
    if os.getppid() == parent:
        select.select([pidfd], [], [])
    os.close(pidfd)


def cleanup(kind: str, target: str) -> None:
    if kind == "process-group":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(target), signal.SIGKILL)
        return
    from hypha.accelerate_executor.shim.engine import connect, remove_container

    remove_container(connect(), target)


def main(argv: list[str]) -> int:
    parent, kind, target = int(argv[0]), argv[1], argv[2]
    wait_for_exit(parent)
    try:
        cleanup(kind, target)
    except Exception:
        return 1  # nobody reads this process's output; the next shim's reaper retries
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
