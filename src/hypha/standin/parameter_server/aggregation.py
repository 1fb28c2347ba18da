"""The parameter server's side of a round, around its math (server.py): wait for a
pseudo-gradient from every running worker, or from a quorum of them once a grace time has
passed (upstream's rule), average them in the background, and queue the update for every
worker's bridge to pick up as a push. An update that misses its round's aggregate stays
pending and goes into the next one."""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from hypha.standin.backend import PEER_SEND_RETRY_S, Push
from hypha.standin.parameter_server.server import NesterovOuterOptimizer

MAX_WAIT_S = 30.0
# How long a forwarded push waits for its bridge's verdict beyond the pusher's tries: the
# bridge's poll and the verdict's way back. A bridge that never answers (its job is gone)
# counts as a refusal, as an unreachable peer fails upstream's send.
VERDICT_MARGIN_S = 5.0


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
        reported: Callable[[list[str]], list[str]] = lambda jobs: jobs,
        quorum: int | None = None,
        grace_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        rounds: int | None = None,
    ) -> None:
        """`reported(jobs)`: those of `jobs` whose `sent-update` the scheduler has heard.
        `quorum` (None: every sender) and `grace_s`: see maybe_start. `rounds`: the job's;
        none is averaged after the last (None: no end)."""
        self.peer = peer
        self._reported = reported
        self.quorum = quorum
        self.grace_s = grace_s
        self._clock = clock
        self._first_at: float | None = None  # the round's first reported update
        self._timer: threading.Timer | None = None
        self.rounds: list[dict[str, Any]] = []
        self.optimizer = optimizer
        self._lock = lock
        self._senders = senders
        self._closed = closed
        self._failed = failed
        self._pending: dict[str, bytes] = {}
        self._pushes: dict[str, list[Push]] = {}
        self._seq: dict[str, int] = {}
        # (job, seq) -> the bridge's verdict, for the forwarded pushes whose pusher waits.
        self._verdicts: dict[tuple[str, int], bool | None] = {}
        # (job, seq) -> the round of each broadcast push, to name a refused one.
        self._broadcast_rounds: dict[tuple[str, int], int] = {}
        self._busy = False
        self._rounds = rounds
        self._averaging: threading.Thread | None = None

    def submit(self, job_id: str, data: bytes) -> bool:
        """Takes a job's pseudo-gradient; False when it is its second of the round."""
        first = job_id not in self._pending
        self._pending[job_id] = data
        self.maybe_start()
        return first

    def maybe_start(self) -> None:
        """Starts the average once every sender's update is in, or, as upstream's
        scheduler decides (rl_scheduler.rs, index id 66840749586), once `quorum` of them
        (at most all) are in and `grace_s` has passed since the first. An update counts as
        in once its file is here and its `sent-update` has reached the scheduler: upstream
        aggregates on the scheduler's record of who sent, and a round closed on a file
        alone would leave its `sent-update` to be counted in the next round. The updates
        left out stay pending, for the next round."""
        senders = self._senders()
        if self._busy or not self._pending or senders is None or not senders:
            return
        if self._rounds is not None and len(self.rounds) >= self._rounds:
            return  # the job is over: an update that missed the last round stays out
        ready = self._reported([job for job in senders if job in self._pending])
        if not ready:
            return
        if len(ready) < len(senders):
            now = self._clock()
            if self._first_at is None:
                self._first_at = now
            if self.quorum is None or len(ready) < min(self.quorum, len(senders)):
                return
            if now - self._first_at < self.grace_s:
                self._wake_at(self._first_at + self.grace_s - now)
                return
        files = {job: self._pending.pop(job) for job in ready}
        self._first_at = None
        self._busy = True
        self._averaging = threading.Thread(target=self._average, args=(files,), daemon=True)
        self._averaging.start()

    def join(self, timeout_s: float) -> None:
        """Waits for an average in progress: a process that exits while a thread is inside
        a torch op aborts ("terminate called without an active exception"). Not under the
        lock, which the average takes to finish."""
        if self._averaging is not None:
            self._averaging.join(timeout_s)

    def _wake_at(self, delay_s: float) -> None:
        """Looks again once the grace time is over (no status may come to prompt it)."""
        if self._timer is not None and self._timer.is_alive():
            return

        def wake() -> None:
            with self._lock:
                self.maybe_start()

        self._timer = threading.Timer(delay_s, wake)
        self._timer.daemon = True
        self._timer.start()

    def pending_jobs(self) -> list[str]:
        """The jobs whose update waits for the next round's aggregate."""
        return list(self._pending)

    def forward(self, job_id: str, from_peer: str, data: bytes) -> bool:
        """Queues a file a worker sent to another (a model for a late joiner), which its
        pusher goes on trying for a while, as upstream's bridge does, and waits for the
        target bridge's verdict: whether a receive took it. Under the lock (it waits on it)."""
        key = (job_id, self._queue(job_id, from_peer, data, PEER_SEND_RETRY_S))
        self._verdicts[key] = None
        self._lock.notify_all()
        self._lock.wait_for(
            lambda: self._verdicts[key] is not None, PEER_SEND_RETRY_S + VERDICT_MARGIN_S
        )
        return bool(self._verdicts.pop(key))

    def settle(self, job_id: str, seq: int, taken: bool) -> int | None:
        """A bridge's verdict on its push `seq`. Returns the round of a refused broadcast
        (an aggregate the job's worker never got), else None."""
        key = (job_id, seq)
        if key in self._verdicts:
            self._verdicts[key] = taken
            self._lock.notify_all()
        broadcast_round = self._broadcast_rounds.pop(key, None)
        return None if taken else broadcast_round

    def _queue(self, job_id: str, from_peer: str, data: bytes, retry_s: float = 0.0) -> int:
        seq = self._seq[job_id] = self._seq.get(job_id, 0) + 1
        self._pushes.setdefault(job_id, []).append(Push(seq, from_peer, data, retry_s))
        return seq

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
                # What each update held, as the sender wrote it (jobs in the order above):
                # the sharded tests compare it with what an unsharded worker sends.
                "layouts": [tensor_layout(files[job]) for job in sorted(files)],
            }
            self.rounds.append(record)
            for job_id in self._senders() or []:
                seq = self._queue(job_id, self.peer, update)
                self._broadcast_rounds[(job_id, seq)] = len(self.rounds) - 1
            self._busy = False
            self._closed(record)
            self.maybe_start()
            self._lock.notify_all()


def tensor_layout(data: bytes) -> list[list[object]]:
    """[name, dtype, shape] of every tensor a safetensors file holds, in name order, read from
    its header alone."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return [
        [name, entry["dtype"], entry["shape"]]
        for name, entry in sorted(header.items())
        if name != "__metadata__"
    ]
