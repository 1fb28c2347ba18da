"""A guard process that cleans up after a shim killed with SIGKILL.

The worker SIGKILLs the shim when it outlives the 5 s after SIGTERM, and a SIGKILLed shim
cannot stop what it started: a container keeps running (and, never auto-removed, stays
behind once it exits), a host process group keeps training. The guard is a separate
session, so neither the worker's signals nor a terminal's reach it.

The shim starts its guard before what it guards, and names the target (the container's id,
the group's id) on the guard's stdin as soon as it exists: a guard started after the work
left a window, as long as a Python start under load, in which a SIGKILL leaked the work. The
guard then waits for its stdin to close, which the kernel does when the shim dies however it
dies, and force-removes the container or kills the process group. A shim that ends normally
kills its guard first.

    python -m hypha.accelerate_executor.shim.watchdog container        (stdin: ID)
    python -m hypha.accelerate_executor.shim.watchdog process-group    (stdin: PGID)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Literal

Kind = Literal["container", "process-group"]


class Watchdog:
    """A guard for work about to start: `arm(target)` once it exists, `disarm()` once it is
    cleaned up normally."""

    def __init__(self, kind: Kind) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, kind],
            stdin=subprocess.PIPE,
            # Not the shim's stdout: the worker reads that pipe until every writer closes it.
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def arm(self, target: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(f"{target}\n".encode())
        self._process.stdin.flush()

    def disarm(self) -> None:
        self._process.kill()
        self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()


def cleanup(kind: str, target: str) -> None:
    if kind == "process-group":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(target), signal.SIGKILL)
        return
    from hypha.accelerate_executor.shim.engine import connect, remove_container

    remove_container(connect(), target)


def main(argv: list[str]) -> int:
    kind = argv[0]
    target = sys.stdin.readline().strip()
    if not target:  # the shim died before its work existed, or between starting it and
        return 0  # naming it (one write's time): nothing is known to clean up
    sys.stdin.read()  # until the shim is gone
    try:
        cleanup(kind, target)
    except Exception:
        return 1  # nobody reads this process's output; the next shim's reaper retries
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
