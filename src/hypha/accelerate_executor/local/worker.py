"""A local Hypha worker: runs one job's executor exactly as protocol.md section 1 says.

Fresh WORK_DIR, a bridge on WORK_DIR/bridge.sock, tokens substituted inside every
argument, the child's stdout re-printed line by line, SIGTERM then SIGKILL 5 s later on
cancellation, and afterwards the bridge stopped and WORK_DIR deleted, naming every file
the worker's user could not delete. Torch-free, so a compose worker needs only the shim.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from hypha.accelerate_executor.errors import BackendError, CoordinatorError, WorkerError
from hypha.accelerate_executor.local.backend import BridgeBackend
from hypha.accelerate_executor.local.bridge_server import BridgeServer
from hypha.accelerate_executor.local.coordinator_client import CoordinatorClient
from hypha.accelerate_executor.local.output import say, warn
from hypha.accelerate_executor.shim.worker_host import MAX_SOCKET_PATH_BYTES, console_script
from hypha.accelerate_executor.supervisor import (
    Interrupts,
    StopPolicy,
    Supervisor,
    signal_exit_status,
)

TOKENS = re.compile(r"\{(SOCKET_PATH|WORK_DIR|JOB_JSON)\}")
# No `--job {JOB_JSON}`: the job reaches the executor as JOB_JSON in its environment, as
# worker-config's entries have it (a command line is readable by every local user).
EXECUTOR_ARGS = ("--socket", "{SOCKET_PATH}", "--work-dir", "{WORK_DIR}")
# A Hypha worker signals only its direct child, SIGKILLs it 5 s later, and leaves what the
# child started alone (protocol.md section 1): the local worker plays exactly that.
HYPHA_WORKER_KILL_AFTER_S = 5.0


@dataclass(frozen=True)
class ExecutorEntry:
    """An `[[executors]]` entry of a worker TOML: what the worker spawns."""

    cmd: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def preset(name: str, *, trust_remote_code: bool = False) -> ExecutorEntry:
    """`process`: the executor as a plain Python process; `shim`: through the cpu image.

    `trust_remote_code`: the executor may run a model's own code (the lenet job's model is
    remote code). A native executor is not sandboxed, so it refuses that unless
    HYPHA_TRUST_REMOTE_CODE=1; the local worker sets it only for the model this project
    generates itself, offline."""
    if name == "process":
        env = (("HYPHA_TRUST_REMOTE_CODE", "1"),) if trust_remote_code else ()
        return ExecutorEntry(
            sys.executable, ("-m", "hypha.accelerate_executor.training", *EXECUTOR_ARGS), env
        )
    if name == "shim" or name.startswith("shim:"):
        variant = name.partition(":")[2] or "cpu"
        trust = ("--trust-remote-code",) if trust_remote_code else ()
        return ExecutorEntry(
            console_script(), ("run", "--variant", variant, *trust, *EXECUTOR_ARGS)
        )
    raise WorkerError(
        f"unknown executor preset {name!r}: use process, shim, shim:VARIANT or toml:PATH"
    )


def load_toml_entry(path: Path) -> ExecutorEntry:
    """The first `[[executors]]` entry with class train and runtime process."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkerError(f"cannot read worker config {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise WorkerError(f"worker config {path} is not valid TOML: {exc}") from None
    entries = document.get("executors", [])
    if not isinstance(entries, list):
        raise WorkerError(f"{path}: executors must be an array of tables ([[executors]])")
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or entry.get("class") != "train"
            or entry.get("runtime") != "process"
        ):
            continue
        cmd, args = entry.get("cmd"), entry.get("args", [])
        if not isinstance(cmd, str) or not cmd:
            raise WorkerError(f"{path}: executor {entry.get('name')!r} has no cmd")
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            raise WorkerError(
                f"{path}: executor {entry.get('name')!r} args must be a list of strings"
            )
        return ExecutorEntry(cmd, tuple(args))
    raise WorkerError(
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


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    work_dir: Path
    leaks: list[str]


class LocalWorker:
    def __init__(
        self,
        name: str,
        executor: ExecutorEntry,
        work_base: Path,
        *,
        owner: tuple[int, int] | None = None,
        keep_work_dir: bool = False,
        keepalive_s: float = 5.0,
        kill_after_s: float = HYPHA_WORKER_KILL_AFTER_S,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.executor = executor
        self.work_base = Path(work_base)
        self.owner = owner
        self.keep_work_dir = keep_work_dir
        self.keepalive_s = keepalive_s
        self.kill_after_s = kill_after_s
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._supervisor: Supervisor | None = None
        self._why = ""
        self._cancelled = False

    def run(self, job_json: str, backend: BridgeBackend) -> JobResult:
        """Runs the job's executor to its end and cleans up after it."""
        work_dir = self._make_work_dir()
        try:
            bridge = BridgeServer(
                work_dir,
                backend,
                owner=self.owner,
                keepalive_s=self.keepalive_s,
                name=f"{self.name} bridge",
            )
            try:
                bridge.start()
            except OSError as exc:
                raise WorkerError(
                    f"cannot serve the bridge on {bridge.socket_path}: {exc.strerror or exc}"
                ) from None
            try:
                exit_code = self._run_executor(work_dir, bridge.socket_path, job_json)
            finally:
                bridge.stop()
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        leaks = [] if self.keep_work_dir else remove_work_dir(work_dir, self.owner)
        for leak in leaks:
            warn(self.name, f"leak: the worker's user cannot delete {leak}")
        return JobResult(exit_code, work_dir, leaks)

    def cancel(self) -> None:
        """SIGTERM to the executor (its process only, as the worker does); SIGKILL 5 s later."""
        with self._lock:
            self._cancelled = True
            if self._supervisor is not None:
                self._stop("ignored SIGTERM", signal.SIGTERM)

    def _make_work_dir(self) -> Path:
        try:
            self.work_base.mkdir(parents=True, exist_ok=True)
            work_dir = self.work_base / f"hypha-{uuid.uuid4()}"
            work_dir.mkdir()
            if self.owner is not None and os.geteuid() == 0:
                os.chown(work_dir, *self.owner)
        except OSError as exc:
            raise WorkerError(
                f"cannot create a work dir under {self.work_base}: {exc.strerror}"
            ) from None
        socket_bytes = len(os.fsencode(work_dir / "bridge.sock"))
        if socket_bytes > MAX_SOCKET_PATH_BYTES:
            work_dir.rmdir()
            raise WorkerError(
                f"the socket path under {self.work_base} would be {socket_bytes} bytes, Unix sockets allow "
                f"{MAX_SOCKET_PATH_BYTES}: use a shorter work base"
            )
        return work_dir

    def _run_executor(self, work_dir: Path, socket_path: Path, job_json: str) -> int:
        values = {"SOCKET_PATH": str(socket_path), "WORK_DIR": str(work_dir), "JOB_JSON": job_json}
        argv = [self.executor.cmd, *(substitute(arg, values) for arg in self.executor.args)]
        policy = StopPolicy(whole_group=False, grace_s=self.kill_after_s, kill_leftovers=False)
        supervisor = Supervisor(Interrupts(signals=()), policy)
        reading = _StdoutReader(self)
        with self._lock:
            if self._cancelled:
                return signal_exit_status(signal.SIGTERM)
            try:
                # Its own process group: a Ctrl-C at the terminal reaches this process, which
                # cancels the job the worker's way, and not the executor directly.
                supervisor.start(
                    argv,
                    {**os.environ, **dict(self.executor.env), **self.env, **values},
                    on_output=reading.feed,
                )
            except OSError as exc:
                raise WorkerError(
                    f"cannot start the executor {self.executor.cmd}: {exc.strerror}"
                ) from None
            self._supervisor = supervisor
        exit_code = supervisor.wait()
        with self._lock:
            self._supervisor = None
        if supervisor.killed:
            warn(self.name, f"the executor {self._why} after {self.kill_after_s:g} s: SIGKILL")
        if supervisor.output_held:
            warn(self.name, "processes the executor started still hold its stdout after it exited")
        return exit_code

    def _stop(self, why: str, signum: int | None) -> None:
        """Stops the executor as the worker does: `signum` (if any), SIGKILL 5 s later."""
        supervisor = self._supervisor
        if supervisor is not None and not supervisor.interrupts.stopping:
            self._why = why
            supervisor.interrupts.stop(signum)


class _StdoutReader:
    """Re-prints the child's stdout; like the worker, stops at the first non-UTF-8 line or
    when the child closes it, and has the child killed 5 s later."""

    def __init__(self, worker: LocalWorker) -> None:
        self._worker = worker
        self._pending = b""

    def feed(self, chunk: bytes) -> bool:
        worker = self._worker
        if not chunk:
            if self._pending and not self._echo(self._pending):
                return False
            with worker._lock:
                worker._stop("closed its stdout and is still running", None)
            return False
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        return all(self._echo(line) for line in lines)

    def _echo(self, line: bytes) -> bool:
        worker = self._worker
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            warn(
                worker.name,
                f"the executor wrote a non-UTF-8 line; stopped reading its stdout, killing it in {worker.kill_after_s:g} s",
            )
            with worker._lock:
                worker._stop("wrote a non-UTF-8 line and is still running", None)
            return False
        say(worker.name, text.removesuffix("\r"))
        return True


def remove_work_dir(work_dir: Path, owner: tuple[int, int] | None) -> list[str]:
    """Deletes WORK_DIR as the worker's user would; returns what that user could not delete.

    As root with `owner`, the deletion runs as that uid/gid, so a file the executor made
    as another user (root in a container that ignored --user) shows up as the leak it is
    for a real worker; root then removes the rest so nothing stays behind here.
    """
    if owner is not None and os.geteuid() == 0 and owner[0] != 0:
        subprocess.run(
            ["find", str(work_dir), "-mindepth", "1", "-delete"],
            user=owner[0],
            group=owner[1],
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        leaks = [str(path) for path in _leaves(work_dir)]
        shutil.rmtree(work_dir, ignore_errors=True)
        return leaks
    leaks = _delete_tree(work_dir)
    with suppress(OSError):
        work_dir.rmdir()
    return leaks


def _leaves(directory: Path) -> list[Path]:
    """Files, links and empty directories under `directory`: what a failed delete left."""
    found = []
    for entry in os.scandir(directory):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            below = _leaves(path)
            found += below or [path]
        else:
            found.append(path)
    return found


def _delete_tree(directory: Path) -> list[str]:
    failed = []
    for entry in os.scandir(directory):
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                below = _delete_tree(path)
                failed += below
                if not below:
                    path.rmdir()
            else:
                path.unlink()
        except OSError:
            failed.append(str(path))
    return failed


def serve_one_job(
    client: CoordinatorClient,
    worker: LocalWorker,
    backend: Callable[[str], BridgeBackend] | None = None,
) -> int:
    """Asks the coordinator for a job, runs it (cancelling it if the coordinator does), reports
    the end. The job's bridge reaches the coordinator through `backend(job_id)`, by default
    over the client's TCP API."""
    job_json = client.request_job(worker.name)
    job_id = json.loads(job_json)["job_id"]
    finished = threading.Event()
    watcher = threading.Thread(
        target=_follow_cancellation, args=(client, job_id, worker, finished), daemon=True
    )
    watcher.start()
    try:
        result = worker.run(job_json, (backend or client.backend)(job_id))
    except WorkerError:
        _report_exit(client, worker, job_id, 1, [])
        raise
    finally:
        finished.set()
    _report_exit(client, worker, job_id, result.exit_code, result.leaks)
    return result.exit_code


def _report_exit(
    client: CoordinatorClient, worker: LocalWorker, job_id: str, code: int, leaks: list[str]
) -> None:
    # A coordinator that is gone must not hide the executor's own exit code.
    try:
        client.report_exit(job_id, code, leaks)
    except CoordinatorError as exc:
        warn(worker.name, str(exc))


def _follow_cancellation(
    client: CoordinatorClient, job_id: str, worker: LocalWorker, finished: threading.Event
) -> None:
    while not finished.wait(1.0):
        try:
            state = client.call("GET", f"/jobs/{job_id}")
        except BackendError:
            continue
        if state.get("state") == "cancelled":
            say(worker.name, f"job cancelled by the coordinator: {state.get('reason')}")
            worker.cancel()
            return
