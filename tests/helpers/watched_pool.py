"""Two real executors trained against the stand-in, each job's statuses and answers noted on
their way to the coordinator: what the clock-skew test asserts on and its bench times
(tests/system/test_clock_skew.py, bench/clock_skew.py)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypha.standin.coordinator.client import CoordinatorClient, JobBackend
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

WORKERS = ("w1", "w2")


@dataclass
class Seen:
    """One worker's statuses and the kinds of the answers it got, timed."""

    states: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    sent_rounds: list[int] = field(default_factory=list)  # executor rounds in sent-update
    joined_at: float | None = None
    ended_at: float | None = None  # its `terminate` answer


class Watched:
    """A job's way to the coordinator, noting each status and answer."""

    def __init__(self, backend: JobBackend, seen: Seen) -> None:
        self._backend, self._seen = backend, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        details, seen = request["status"]["details"], self._seen
        seen.states.append(details["state"])
        if details["state"] == "joined" and seen.joined_at is None:
            seen.joined_at = time.monotonic()
        if details["state"] == "sent-update":
            seen.sent_rounds.append(int(details["round"]))
        answer = self._backend.action(request)
        seen.kinds.append(answer["next"]["action"]["kind"])
        if seen.kinds[-1] == "terminate":
            seen.ended_at = time.monotonic()
        return answer


def applied(seen: Seen) -> int:
    """The aggregates a worker applied: its executor's round at its last send (those applied
    before it), plus the last one when an `applied-update` came after that send."""
    if "sent-update" not in seen.states:
        return 0
    last = len(seen.states) - 1 - seen.states[::-1].index("sent-update")
    return seen.sent_rounds[-1] + int("applied-update" in seen.states[last:])


@dataclass
class PoolRun:
    codes: dict[str, int]  # each worker's executor's exit code
    seen: dict[str, Seen]
    summary: dict[str, Any]  # the coordinator's


def run_pool(catalog: Catalog, options: RunOptions, base: Path, timeout_s: float) -> PoolRun:
    """One run of WORKERS, each an executor process; a run not ended within `timeout_s` is
    cancelled."""
    seen = {name: Seen() for name in WORKERS}
    codes: dict[str, int] = {}
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    with build_coordinator(catalog, options) as coordinator:
        client = CoordinatorClient(coordinator.url)

        def run(name: str) -> None:
            worker = LocalWorker(name, preset("process"), base, env={"OMP_NUM_THREADS": threads})
            backend = lambda job_id: Watched(client.backend(job_id), seen[name])  # noqa: E731
            codes[name] = serve_one_job(client, worker, backend)

        running = [threading.Thread(target=run, args=(n,), daemon=True) for n in seen]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(timeout_s)
        if any(thread.is_alive() for thread in running):
            coordinator.cancel(f"the run did not end within {timeout_s:g} s")
            for thread in running:
                thread.join(30)
        summary = coordinator.summary()
    return PoolRun(codes, seen, summary)
