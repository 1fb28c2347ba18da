"""Running one executor container to its end: create, attach, start, stream, wait, remove.

Order matters. The output stream is attached before the container starts, so no line is
lost; the exit code comes from `wait`, and the state (OOMKilled) from an inspect after it,
which is why the container is never auto-removed: it is removed here, explicitly, on every
path out, and by the watchdog if this process is SIGKILLed.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.errors import DockerError
from hypha.accelerate_executor.shim.container_spec import ContainerSpec
from hypha.accelerate_executor.shim.engine import explain, gone_counts_as_done, remove_container
from hypha.accelerate_executor.shim.line_writer import LineWriter
from hypha.accelerate_executor.shim.reaper import reap_stale
from hypha.accelerate_executor.shim.watchdog import Watchdog
from hypha.accelerate_executor.supervisor import DRAIN_S, GRACE_S, Interrupts

if TYPE_CHECKING:
    from docker import APIClient

# The supervisor's grace, in the whole seconds `docker stop` takes: the worker SIGKILLs 5 s
# after SIGTERM, and the engine's kill and the removal still fit.
STOP_GRACE_S = math.ceil(GRACE_S)


@dataclass(frozen=True)
class Outcome:
    exit_code: int  # the container's own
    oom_killed: bool
    cancelled_by: str | None  # the signal that asked for the stop, if one did


def _pump(stream: Iterator[tuple[bytes | None, bytes | None]]) -> None:
    stdout, stderr = LineWriter(sys.stdout.fileno()), LineWriter(sys.stderr.fileno())
    try:
        for out, err in stream:
            if out:
                stdout.feed(out)
            if err:
                stderr.feed(err)
    except Exception:
        pass  # the connection dropped; the exit code still comes from `wait`
    stdout.close()
    stderr.close()


class _Waiter(threading.Thread):
    """`wait` blocks without a timeout for as long as the job trains, so it gets a thread."""

    def __init__(self, api: APIClient, container_id: str, interrupts: Interrupts) -> None:
        super().__init__(daemon=True)
        self._api, self._id, self._interrupts = api, container_id, interrupts
        self.result: dict[str, Any] | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            self.result = self._api.wait(self._id)
        except Exception as exc:
            self.error = str(getattr(exc, "explanation", None) or exc)
        self._interrupts.job_ended()


def run_container(api: APIClient, spec: ContainerSpec, interrupts: Interrupts) -> Outcome:
    from docker.errors import APIError

    if interrupts.signum is not None:  # cancelled while starting up: nothing to create
        return Outcome(interrupts.exit_code, False, interrupts.signal_name)
    watchdog = Watchdog("container")
    try:
        container_id = api.create_container(**spec.create_kwargs(api))["Id"]
    except APIError as exc:
        watchdog.disarm()
        raise DockerError(f"cannot create the container: {explain(exc)}") from None
    except BaseException:
        watchdog.disarm()
        raise
    watchdog.arm(container_id)
    try:
        return _run_created(api, container_id, interrupts)
    finally:
        try:
            remove_container(api, container_id)
        except APIError as exc:
            print(
                f"hypha-accelerate run: container {container_id[:12]} not removed: {explain(exc)}",
                file=sys.stderr,
            )
        else:
            watchdog.disarm()


def _run_created(api: APIClient, container_id: str, interrupts: Interrupts) -> Outcome:
    from docker.errors import APIError

    try:
        stream = api.attach(
            container_id, stdout=True, stderr=True, stream=True, logs=True, demux=True
        )
        pump = threading.Thread(target=_pump, args=(stream,), daemon=True)
        pump.start()
        api.start(container_id)
    except APIError as exc:
        raise DockerError(f"cannot start the container: {explain(exc)}") from None
    waiter = _Waiter(api, container_id, interrupts)
    waiter.start()
    try:
        reap_stale(api)  # here, not earlier: the container is already running
    except APIError as exc:
        print(
            f"hypha-accelerate run: stale containers not removed: {explain(exc)}", file=sys.stderr
        )
    interrupts.wait_for_end()
    if not interrupts.ended:
        with gone_counts_as_done():
            # SIGTERM (through the container's init), STOP_GRACE_S, then SIGKILL.
            api.stop(container_id, timeout=STOP_GRACE_S)
        waiter.join()
    pump.join(DRAIN_S)
    if waiter.result is None:
        raise DockerError(f"lost the container while waiting for it: {waiter.error}")
    exit_code = int(waiter.result.get("StatusCode", 1))
    oom_killed = False
    if exit_code != 0:
        state = api.inspect_container(container_id).get("State") or {}
        oom_killed = bool(state.get("OOMKilled"))
    cancelled_by = interrupts.signal_name if interrupts.signum is not None else None
    return Outcome(exit_code, oom_killed, cancelled_by)
