"""Faults on demand: a worker's bridge that answers chosen routes with chosen upstream-shaped
errors, a chosen number of times, as a real worker's bridge does when its remote side is
unreachable for a moment (docs/protocol.md section 2: 500 with `network_error`,
`connector_error` or `io_error`; 400 with `invalid_request` or `hash_mismatch`).

A fault is written `ROUTE=STATUS:ERROR[:TIMES]` (TIMES 1 unless given), e.g.
`/resources/send=500:connector_error:1`; or `ROUTE=kill`: the executor process that made the
route's first request is killed (SIGKILL, the sender read off the Unix socket), a peer that
dies mid-round. A fault answers the route's first TIMES requests of each job, after their
bodies were read (so the executor's request was whole), and touches nothing behind the
bridge: the scheduler, data node or peer never sees those requests.

Three more play upstream's bridge's own ways (docs/faults.md cites its source):
`/resources/receive=busy[:TIMES]` answers 204 at once, as upstream's action-era bridge does
when its connector cannot register the receive (one registration at a time);
`/resources/receive=slow:SECONDS[:TIMES]` serves the receive but writes its file over SECONDS,
a push over a slow link: upstream's bridge stops the receive's idle timer once data flows, so
the answer may come long after the deadline; `/resources/fetch=truncated[:TIMES]` serves the
first TIMES fetches of data slices with the file cut to half its bytes, as upstream's bridge returns a slice that a failed
download left truncated in its `artifacts/` cache (it returns a cached file unchecked); and
`/resources/receive=cut[:TIMES]` ends alpha.17's receive stream after its first event, a
stream that breaks mid-job. And `/action/update=scheduler-error[:AFTER]` serves the route's
first AFTER requests (default 0), then answers the next with what upstream's scheduler
answers when handling a request fails inside it (rl_scheduler.rs, index id 66469012466): a
gymnasium executor's `terminate`, for any executor.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
from dataclasses import dataclass

from hypha.accelerate_executor.errors import UsageError

KILL = "kill"
BUSY = "busy"
SLOW = "slow"
TRUNCATED = "truncated"
CUT = "cut"
SCHEDULER_ERROR = "scheduler-error"
# The faults the bridge plays itself, and the one route each is for.
PLAYED = {
    BUSY: "/resources/receive",
    SLOW: "/resources/receive",
    CUT: "/resources/receive",
    TRUNCATED: "/resources/fetch",
    SCHEDULER_ERROR: "/action/update",
}
ROUTES = (
    "/resources/fetch",
    "/resources/send",
    "/resources/receive",
    "/status/send",
    "/action/update",
)


@dataclass(frozen=True)
class Fault:
    route: str
    status: int
    error: str
    times: int = 1
    seconds: float = 0.0  # how long a `slow` receive takes to write its file
    after: int = 0  # how many of the route's requests are served before the fault

    @property
    def kills(self) -> bool:
        return self.error == KILL

    @property
    def served(self) -> bool:
        """Served, with a twist the bridge itself plays (JobBridge.receive_one, fetch)."""
        return self.error in (SLOW, TRUNCATED, CUT)

    def body_for(self, job_id: object) -> bytes:
        if self.error == SCHEDULER_ERROR:
            terminate = {"executor": "gymnasium", "action": {"kind": "terminate"}}
            return json.dumps({"job_id": job_id, "next": terminate}).encode()
        return self.body

    @property
    def body(self) -> bytes:
        if self.error == BUSY:
            return b""
        detail = f"injected fault: {self.error} on {self.route}"
        return json.dumps({"error": self.error, "detail": detail}).encode()


def parse_fault(text: str) -> Fault:
    """`ROUTE=STATUS:ERROR[:TIMES]`, `ROUTE=kill`, `/resources/receive=busy[:TIMES]` or
    `/resources/receive=slow:SECONDS[:TIMES]` as a Fault; UsageError naming what is wrong."""
    route, _, answer = text.partition("=")
    parts = answer.split(":")
    if route not in ROUTES:
        raise UsageError(f"fault {text!r}: the route is not one of {', '.join(ROUTES)}")
    if answer == KILL:
        return Fault(route, 0, KILL)
    if parts[0] in PLAYED:
        return _played_fault(text, route, parts)
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"fault {text!r}: expected ROUTE=STATUS:ERROR[:TIMES]")
    try:
        status, times = int(parts[0]), int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise UsageError(f"fault {text!r}: STATUS and TIMES are whole numbers") from None
    if not 400 <= status <= 599 or times < 1:
        raise UsageError(f"fault {text!r}: STATUS is 4xx or 5xx, TIMES at least 1")
    return Fault(route, status, parts[1], times)


def _played_fault(text: str, route: str, parts: list[str]) -> Fault:
    kind, rest = parts[0], parts[1:]
    if route != PLAYED[kind]:
        raise UsageError(f"fault {text!r}: {kind} is a fault of {PLAYED[kind]} only")
    if kind == SCHEDULER_ERROR:
        if len(rest) > 1 or not all(part.isdigit() for part in rest):
            raise UsageError(f"fault {text!r}: expected {route}={kind}[:AFTER], AFTER a count")
        return Fault(route, 200, kind, after=int(rest[0]) if rest else 0)
    try:
        seconds = float(rest.pop(0)) if kind == SLOW and rest else -1.0
        times = int(rest.pop(0)) if rest else 1
    except ValueError:
        raise UsageError(f"fault {text!r}: SECONDS is a number, TIMES a whole number") from None
    if rest or (kind == SLOW and seconds <= 0) or times < 1:
        usage = "slow:SECONDS[:TIMES], SECONDS above 0" if kind == SLOW else f"{kind}[:TIMES]"
        raise UsageError(f"fault {text!r}: expected {route}={usage}, TIMES at least 1")
    return Fault(route, 204 if kind == BUSY else 200, kind, times, max(seconds, 0.0))


class FaultPlan:
    """The faults of one job's bridge, counted down as they are answered."""

    def __init__(self, faults: tuple[Fault, ...] = ()) -> None:
        self._faults = {fault.route: fault for fault in faults}
        self._left = {fault.route: fault.times for fault in faults}
        self._to_serve = {fault.route: fault.after for fault in faults}
        self._lock = threading.Lock()

    def take(self, route: str, data_slice: bool = False) -> Fault | None:
        """The fault to answer this request of `route` with, or None to serve it.
        `data_slice`: the request is a fetch of a data slice, the one kind of fetch that
        upstream's bridge caches and a `truncated` fault plays."""
        with self._lock:
            if self._left.get(route, 0) == 0:
                return None
            if self._faults[route].error == TRUNCATED and not data_slice:
                return None
            if self._to_serve[route] > 0:
                self._to_serve[route] -= 1
                return None
            self._left[route] -= 1
            return self._faults[route]


def kill_sender(connection: socket.socket) -> int:
    """SIGKILL to the process at the other end of a Unix-socket connection; its pid."""
    pid, _, _ = struct.unpack(
        "3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    )
    os.kill(pid, signal.SIGKILL)
    return int(pid)
