"""What a local worker spawns for a job: an `[[executors]]` entry of a worker TOML, or a
preset of one, and the worker's tokens substituted in its arguments (docs/protocol.md section 1).

An entry is named on the command line (`--executor`), so a bad one is a usage error.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from hypha.accelerate_executor.errors import UsageError
from hypha.accelerate_executor.worker_facts import console_script

TOKENS = re.compile(r"\{(SOCKET_PATH|WORK_DIR|JOB_JSON)\}")
# No `--job {JOB_JSON}`: the job reaches the executor as JOB_JSON in its environment, as
# worker-config's entries have it (a command line is readable by every local user).
EXECUTOR_ARGS = ("--socket", "{SOCKET_PATH}", "--work-dir", "{WORK_DIR}")


@dataclass(frozen=True)
class ExecutorEntry:
    """An `[[executors]]` entry of a worker TOML: what the worker spawns."""

    cmd: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # Runs as the work dir's owner when the worker is root (compose's, which is root only to
    # reach the engine's socket), as a Hypha worker runs its executors as its own user; the
    # shim stays root there, to reach the socket, and runs the container as the owner.
    as_owner: bool = False


def preset(name: str, *, trust_remote_code: bool = False) -> ExecutorEntry:
    """`process`: the executor as a plain Python process; `shim`: through the cpu image.

    `trust_remote_code`: the executor may run a model's own code (the lenet job's model is
    remote code). A native executor is not sandboxed, so it refuses that unless
    HYPHA_TRUST_REMOTE_CODE=1; the local worker sets it only for the model this project
    generates itself, offline."""
    if name == "process":
        env = (("HYPHA_TRUST_REMOTE_CODE", "1"),) if trust_remote_code else ()
        return ExecutorEntry(
            sys.executable,
            ("-m", "hypha.accelerate_executor.training", *EXECUTOR_ARGS),
            env,
            as_owner=True,
        )
    if name == "shim" or name.startswith("shim:"):
        variant = name.partition(":")[2] or "cpu"
        trust = ("--trust-remote-code",) if trust_remote_code else ()
        return ExecutorEntry(
            console_script(), ("run", "--variant", variant, *trust, *EXECUTOR_ARGS)
        )
    raise UsageError(
        f"unknown executor preset {name!r}: use process, shim, shim:VARIANT or toml:PATH"
    )


def load_toml_entry(path: Path) -> ExecutorEntry:
    """The first `[[executors]]` entry with class train and runtime process."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read worker config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"worker config {path} is not valid TOML: {exc}") from None
    entries = document.get("executors", [])
    if not isinstance(entries, list):
        raise UsageError(f"{path}: executors must be an array of tables ([[executors]])")
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or entry.get("class") != "train"
            or entry.get("runtime") != "process"
        ):
            continue
        cmd, args = entry.get("cmd"), entry.get("args", [])
        if not isinstance(cmd, str) or not cmd:
            raise UsageError(f"{path}: executor {entry.get('name')!r} has no cmd")
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            raise UsageError(
                f"{path}: executor {entry.get('name')!r} args must be a list of strings"
            )
        return ExecutorEntry(cmd, tuple(args))
    raise UsageError(
        f'{path} has no [[executors]] entry with class = "train" and runtime = "process"'
    )


def executor_entry(spec: str, *, trust_remote_code: bool = False) -> ExecutorEntry:
    """`process`, `shim` (the cpu variant), `shim:VARIANT` or `toml:PATH` (taken as it is)."""
    if spec.startswith("toml:"):
        return load_toml_entry(Path(spec.removeprefix("toml:")))
    return preset(spec, trust_remote_code=trust_remote_code)


def substitute(arg: str, values: dict[str, str]) -> str:
    """Replaces the worker's tokens anywhere in `arg` in one pass; other {TOKENS} stay."""
    return TOKENS.sub(lambda match: values[match.group(1)], arg)
