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

    @property
    def kills(self) -> bool:
        return self.error == KILL

    @property
    def body(self) -> bytes:
        detail = f"injected fault: {self.error} on {self.route}"
        return json.dumps({"error": self.error, "detail": detail}).encode()


def parse_fault(text: str) -> Fault:
    """`ROUTE=STATUS:ERROR[:TIMES]` or `ROUTE=kill` as a Fault; UsageError naming what is wrong."""
    route, _, answer = text.partition("=")
    parts = answer.split(":")
    if route not in ROUTES:
        raise UsageError(f"fault {text!r}: the route is not one of {', '.join(ROUTES)}")
    if answer == KILL:
        return Fault(route, 0, KILL)
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"fault {text!r}: expected ROUTE=STATUS:ERROR[:TIMES]")
    try:
        status, times = int(parts[0]), int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise UsageError(f"fault {text!r}: STATUS and TIMES are whole numbers") from None
    if not 400 <= status <= 599 or times < 1:
        raise UsageError(f"fault {text!r}: STATUS is 4xx or 5xx, TIMES at least 1")
    return Fault(route, status, parts[1], times)


class FaultPlan:
    """The faults of one job's bridge, counted down as they are answered."""

    def __init__(self, faults: tuple[Fault, ...] = ()) -> None:
        self._faults = {fault.route: fault for fault in faults}
        self._left = {fault.route: fault.times for fault in faults}
        self._lock = threading.Lock()

    def take(self, route: str) -> Fault | None:
        """The fault to answer this request of `route` with, or None to serve it."""
        with self._lock:
            if self._left.get(route, 0) == 0:
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
