"""`--variant mps-host`: the bundle run as a host process, since Docker on macOS cannot
reach Metal.

The bundle (`hypha-accelerate build mps-host`) is a folder holding the project wheel,
`requirements.txt` (the pinned closure for macOS arm64), `accelerate-configs/mps.yaml` and
its launcher, `hypha-accelerate-mps`, which makes a virtual environment from the wheel and
the requirements on first use, then runs the executor's launcher in it. The shim points
that venv into its cache, keyed by a hash of what goes into it (HYPHA_MPS_VENV), so that
every job of one bundle reuses it and a rebuilt bundle gets a fresh one; it runs the
launcher in its own process group, re-prints its output line by line, and passes
SIGTERM/SIGINT to the group, killing what is left after supervisor.GRACE_S.

Environment: HYPHA_ACCELERATE_BUNDLE (the bundle when --bundle is not given),
HYPHA_ACCELERATE_CACHE (default ~/.cache/hypha-accelerate); PYTHON reaches the bundle's
launcher (the interpreter it makes the venv with, default python3.11).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from hypha.accelerate_executor.errors import DockerError, ShimError
from hypha.accelerate_executor.platform.image_tags import HOST_VARIANT, build_command
from hypha.accelerate_executor.shim.line_writer import LineWriter
from hypha.accelerate_executor.shim.watchdog import Watchdog
from hypha.accelerate_executor.supervisor import Interrupts, Supervisor

LAUNCHER = "hypha-accelerate-mps"
PROJECT_WHEEL = "hypha_accelerate_executor-*.whl"


def cache_dir() -> Path:
    env = os.environ.get("HYPHA_ACCELERATE_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hypha-accelerate"


class Bundle:
    def __init__(self, folder: Path) -> None:
        if not folder.is_dir():
            raise DockerError(
                f"no {HOST_VARIANT} bundle at {folder}; `{build_command(HOST_VARIANT)}` makes one",
            )
        self.folder = folder
        self.launcher = folder / LAUNCHER
        self.wheels = sorted(folder.glob(PROJECT_WHEEL))
        missing = [
            name
            for name, present in (
                (LAUNCHER, os.access(self.launcher, os.X_OK)),
                ("requirements.txt", (folder / "requirements.txt").is_file()),
                (PROJECT_WHEEL, bool(self.wheels)),
                ("accelerate-configs/mps.yaml", (folder / "accelerate-configs/mps.yaml").is_file()),
            )
            if not present
        ]
        if missing:
            raise DockerError(
                f"{folder} is not an {HOST_VARIANT} bundle: no {', '.join(missing)} "
                f"(`{build_command(HOST_VARIANT)}` makes one)",
            )

    def venv_dir(self) -> Path:
        """Where this bundle's venv lives: changes whenever what goes into it changes."""
        digest = hashlib.sha256()
        for path in (self.folder / "requirements.txt", self.launcher, *self.wheels):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return cache_dir() / "mps-venvs" / digest.hexdigest()[:16]


def run_group(command: list[str], env: dict[str, str], interrupts: Interrupts) -> int:
    """Runs `command` in its own process group to its end or to a signal (supervisor.py),
    re-printing its stdout line by line, guarded against this process being SIGKILLed."""
    out = LineWriter(sys.stdout.fileno())
    supervisor = Supervisor(interrupts)
    watchdog = Watchdog("process-group")
    try:
        # Armed before the launcher's output is relayed: a worker that reads "ready" and
        # SIGKILLs this process at once must still find the group guarded.
        supervisor.start(
            command,
            env,
            on_output=lambda chunk: out.feed(chunk) if chunk else out.close(),
            on_spawn=lambda pid: watchdog.arm(str(pid)),
        )
        return supervisor.wait()
    finally:
        watchdog.disarm()


def run_bundle(
    folder: str | None, launcher_args: list[str], env: dict[str, str], interrupts: Interrupts
) -> int:
    folder = folder or os.environ.get("HYPHA_ACCELERATE_BUNDLE")
    if not folder:
        raise ShimError(
            f"{HOST_VARIANT} needs --bundle DIR (or HYPHA_ACCELERATE_BUNDLE): the folder "
            f"`{build_command(HOST_VARIANT)}` made",
        )
    bundle = Bundle(Path(folder))
    venv = bundle.venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if k != "JOB_JSON"}  # it may hold a token
    child_env.update(env, HYPHA_MPS_VENV=str(venv))
    code = run_group([str(bundle.launcher), *launcher_args], child_env, interrupts)
    if interrupts.signum is not None:
        print(f"hypha-accelerate run: cancelled by {interrupts.signal_name}; executor exit {code}",
              file=sys.stderr, flush=True)  # fmt: skip
        return interrupts.exit_code
    return code
