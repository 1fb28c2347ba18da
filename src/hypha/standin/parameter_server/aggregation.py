"""The parameter server's side of a round, around its math (server.py): wait for
one pseudo-gradient from every running worker, average them in the background, and queue
the update for every worker's bridge to pick up as a push."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hypha.standin.backend import Push
from hypha.standin.parameter_server.server import NesterovOuterOptimizer

MAX_WAIT_S = 30.0


class Aggregation:
    """One job's rounds of pseudo-gradients. Every method but the background average runs
    under `lock`, the coordinator's condition; `senders()` names the jobs a round waits for
    (None until every worker has joined) and `closed(record)` hears of each finished round
    (under the lock as well)."""

    def __init__(
        self,
        optimizer: NesterovOuterOptimizer,
        peer: str,
        lock: threading.Condition,
        senders: Callable[[], list[str] | None],
        closed: Callable[[dict[str, Any]], None],
        failed: Callable[[str], None],
        reported: Callable[[list[str]], bool] = lambda jobs: True,
    ) -> None:
        """`reported(jobs)`: whether the scheduler has heard every sender's `sent-update`."""
        self.peer = peer
        self._reported = reported
        self.rounds: list[dict[str, Any]] = []
        self.optimizer = optimizer
        self._lock = lock
        self._senders = senders
        self._closed = closed
        self._failed = failed
        self._pending: dict[str, bytes] = {}
        self._pushes: dict[str, list[Push]] = {}
        self._seq: dict[str, int] = {}
        self._busy = False

    def submit(self, job_id: str, data: bytes) -> bool:
        """Takes a job's pseudo-gradient; False when it is its second of the round."""
        first = job_id not in self._pending
        self._pending[job_id] = data
        self.maybe_start()
        return first

    def maybe_start(self) -> None:
        """Starts the average once every running job has sent its file."""
        senders = self._senders()
        if self._busy or not self._pending or senders is None:
            return
        if any(job not in self._pending for job in senders):
            return
        # Upstream's scheduler tells its parameter server to aggregate only once every
        # worker's `sent-update` is in (rl_scheduler.rs, index id 66469012466); a round
        # closed before that would count a late `sent-update` in the next round.
        if not self._reported(senders):
            return
        files, self._pending = self._pending, {}
        self._busy = True
        threading.Thread(target=self._average, args=(files,), daemon=True).start()

    def forward(self, job_id: str, from_peer: str, data: bytes) -> None:
        """Queues a file a worker sent to another (a model for a late joiner)."""
        self._queue(job_id, from_peer, data)
        self._lock.notify_all()

    def _queue(self, job_id: str, from_peer: str, data: bytes) -> None:
        seq = self._seq[job_id] = self._seq.get(job_id, 0) + 1
        self._pushes.setdefault(job_id, []).append(Push(seq, from_peer, data))

    def next_push(self, job_id: str, after: int, wait_s: float) -> Push | None:
        queue = self._pushes.setdefault(job_id, [])
        queue[:] = [push for push in queue if push.seq > after]
        self._lock.wait_for(lambda: bool(queue), min(wait_s, MAX_WAIT_S))
        return queue[0] if queue else None

    def _average(self, files: dict[str, bytes]) -> None:
        started = time.time()
        try:
            update, skipped = self.optimizer.step_files(list(files.values()))
        except Exception as exc:  # an unreadable file: safetensors and torch raise many kinds
            with self._lock:
                self._busy = False
            # Nobody would ever get this round's update: end the run instead of hanging it.
            self._failed(f"parameter server could not average round {len(self.rounds)}: {exc}")
            return
        with self._lock:
            record = {
                "round": len(self.rounds),
                "jobs": sorted(files),
                "seconds": round(time.time() - started, 3),
                "skipped_tensors": skipped,
            }
            self.rounds.append(record)
            for job_id in self._senders() or []:
                self._queue(job_id, self.peer, update)
            self._busy = False
            self._closed(record)
            self.maybe_start()
            self._lock.notify_all()
