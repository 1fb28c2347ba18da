"""A local Hypha worker: runs one job's executor exactly as docs/protocol.md section 1 says.

Fresh WORK_DIR (work_dirs.py), a bridge on WORK_DIR/bridge.sock, tokens substituted inside
every argument (executor_entries.py), the child's stdout re-printed line by line
(stdout_echo.py), SIGTERM then SIGKILL 5 s later on cancellation, and afterwards the bridge
stopped and WORK_DIR deleted, naming every file the worker's user could not delete. For an
action-era job the runtime is that of the later releases: stderr is kept out of the log and
its tail goes into the job's status (job_status.py), with the stdout's.
Torch-free, so a compose worker needs only the shim.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.accelerate_executor.supervisor import (
    Interrupts,
    StopPolicy,
    Supervisor,
    signal_exit_status,
)
from hypha.standin.backend import BridgeBackend
from hypha.standin.console import say, warn
from hypha.standin.errors import BackendError, CoordinatorError, WorkerError
from hypha.standin.job_status import (
    ERR_TAIL_BYTES,
    OUT_TAIL_BYTES,
    Tail,
    job_status,
)
from hypha.standin.worker.bridge_server import WorkerSettings
from hypha.standin.worker.bridges import BRIDGES, generation_for
from hypha.standin.worker.executor_entries import ExecutorEntry, substitute
from hypha.standin.worker.faults import Fault, FaultPlan
from hypha.standin.worker.stdout_echo import StdoutEcho
from hypha.standin.worker.work_dirs import make_work_dir, remove_work_dir

if TYPE_CHECKING:
    # Only the TCP client's type: urllib3, which it needs, is not in the runtime images,
    # where `selftest` runs this worker against a coordinator in its own process.
    from hypha.standin.coordinator.client import CoordinatorClient

# The OpenTelemetry SDK's endpoint variables (the OTLP exporter spec): a worker with one set,
# and the SDK not disabled, has telemetry configured.
OTLP_ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)

# A Hypha worker signals only its direct child, SIGKILLs it 5 s later, and leaves what the
# child started alone (docs/protocol.md section 1): the local worker plays exactly that.
HYPHA_WORKER_KILL_AFTER_S = 5.0


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    work_dir: Path
    leaks: list[str]
    status: dict[str, Any] | None = None  # the action-era runtime's job status


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
        generation: Generation | None = None,
        strict_receive: bool = True,
        faults: tuple[Fault, ...] = (),
    ) -> None:
        """`generation`: the bridge this worker serves, as a Hypha release's worker does
        (alpha.17's, or the action protocol's of later releases); None: the one the
        coordinator plays, as its job shows (an action-era job names no `updates`).
        `strict_receive` (the default): its action-era bridge plays upstream's: a push no
        open receive takes is refused (after its sender's tries, for a peer's), a receive
        beside an open one answered 204 at once. False, kinder than upstream: such a push is
        kept for the next receive."""
        self.generation = generation
        self.strict_receive = strict_receive
        self.faults = faults  # answered by each job's bridge (faults.py)
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
        work_dir = make_work_dir(self.work_base, self.owner)
        generation = self.generation or generation_for(job_json)
        try:
            settings = WorkerSettings(
                owner=self.owner,
                keepalive_s=self.keepalive_s,
                name=f"{self.name} bridge",
                job_id=str(json.loads(job_json)["job_id"]),
                strict_receive=self.strict_receive,
            )
            bridge = BRIDGES[generation].for_worker(work_dir, backend, settings)
            bridge.faults = FaultPlan(self.faults)
            try:
                bridge.start()
            except OSError as exc:
                raise WorkerError(
                    f"cannot serve the bridge on {bridge.socket_path}: {exc.strerror or exc}"
                ) from None
            try:
                exit_code, status = self._run_executor(
                    work_dir, bridge.socket_path, job_json, bridge.reports_job_status
                )
            finally:
                bridge.stop()
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        leaks = [] if self.keep_work_dir else remove_work_dir(work_dir, self.owner)
        for leak in leaks:
            warn(self.name, f"leak: the worker's user cannot delete {leak}")
        return JobResult(exit_code, work_dir, leaks, status)

    def cancel(self) -> None:
        """SIGTERM to the executor (its process only, as the worker does); SIGKILL 5 s later."""
        with self._lock:
            self._cancelled = True
            if self._supervisor is not None:
                self._stop("ignored SIGTERM", signal.SIGTERM)

    def _run_executor(
        self, work_dir: Path, socket_path: Path, job_json: str, with_status: bool
    ) -> tuple[int, dict[str, Any] | None]:
        """The executor's exit code, and with `with_status` the job status the later
        releases' runtime reports (its stderr then stays out of this worker's output)."""
        values = {"SOCKET_PATH": str(socket_path), "WORK_DIR": str(work_dir), "JOB_JSON": job_json}
        argv = [self.executor.cmd, *(substitute(arg, values) for arg in self.executor.args)]
        policy = StopPolicy(whole_group=False, grace_s=self.kill_after_s, kill_leftovers=False)
        supervisor = Supervisor(Interrupts(signals=()), policy)
        echo = StdoutEcho(self.name, self._stop_reading, self.kill_after_s)
        out, err = Tail(OUT_TAIL_BYTES), Tail(ERR_TAIL_BYTES)

        def on_output(chunk: bytes) -> bool:
            out.feed(chunk)
            return echo.feed(chunk)

        with self._lock:
            if self._cancelled:
                return signal_exit_status(signal.SIGTERM), None
            try:
                # Its own process group: a Ctrl-C at the terminal reaches this process, which
                # cancels the job the worker's way, and not the executor directly.
                env = {**os.environ, **dict(self.executor.env), **self.env}
                as_owner = self.executor.as_owner and self.owner and os.geteuid() == 0
                if as_owner:
                    env["HOME"] = str(work_dir)  # root's HOME is not the owner's to write
                supervisor.start(
                    argv,
                    {**env, **telemetry_env(self.name, env), **values},
                    on_output=on_output if with_status else echo.feed,
                    on_error=err.feed if with_status else None,
                    user=self.owner if as_owner else None,
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
        if not with_status:
            return exit_code, None
        return exit_code, job_status(exit_code, self._cancelled, supervisor.killed, out, err)

    def _stop_reading(self, why: str) -> None:
        """Stdout is no longer read: the executor gets SIGKILL after the grace period."""
        with self._lock:
            self._stop(why, None)

    def _stop(self, why: str, signum: int | None) -> None:
        """Stops the executor as the worker does: `signum` (if any), SIGKILL 5 s later."""
        supervisor = self._supervisor
        if supervisor is not None and not supervisor.interrupts.stopping:
            self._why = why
            supervisor.interrupts.stop(signum)


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
    _report_exit(client, worker, job_id, result.exit_code, result.leaks, result.status)
    return result.exit_code


def _report_exit(
    client: CoordinatorClient,
    worker: LocalWorker,
    job_id: str,
    code: int,
    leaks: list[str],
    status: dict[str, Any] | None = None,
) -> None:
    # A coordinator that is gone must not hide the executor's own exit code.
    try:
        client.report_exit(job_id, code, leaks, status)
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


def telemetry_env(worker: str, env: dict[str, str]) -> dict[str, str]:
    """A later Hypha worker with telemetry configured hands its executors its OTEL_*
    variables (they are in `env`, passed on whole) with its own service name and resource
    attributes (docs/telemetry.md): here the worker's name as `hypha.worker.name`."""
    if not _telemetry_configured(env):
        return {}
    given = env.get("OTEL_RESOURCE_ATTRIBUTES")
    return {
        "OTEL_SERVICE_NAME": env.get("OTEL_SERVICE_NAME") or "hypha-worker",
        "OTEL_RESOURCE_ATTRIBUTES": f"{given + ',' if given else ''}hypha.worker.name={worker}",
    }


def _telemetry_configured(env: dict[str, str]) -> bool:
    """Whether the worker's own OpenTelemetry SDK would export: the spec's rule, read here
    rather than from the executor's telemetry/, which decides for the executor's side."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name) for name in OTLP_ENDPOINT_VARIABLES)
