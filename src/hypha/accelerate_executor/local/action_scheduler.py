"""The action-era train scheduler's answers (docs/protocol-actions.md section 4), as upstream's
rl_scheduler.rs (id 66469012466, the one scheduler found that sends `execute-batch{batches}`)
and batch_scheduler.rs decide them:

- a round has a sample target; each `batch-completed` adds `batch_size x batches` samples to
  the round and to the worker's share;
- a worker's per-batch time is the time since its last report over `batches`, a running mean;
  its first report, `applied-update` and `batches: 0` only reset its clock;
- `batches` is 1 until every worker has a time; then every worker is played forward at its
  mean until the round's samples run out or one reaches MULTI_BATCH_SIZE, and the reporter
  gets its own count, which may be 0;
- at the target, `send-update{weight}`, weight = the worker's samples / the round's; once
  every worker sent, the parameter server aggregates and broadcasts; an `idle` from a worker
  that has not applied the broadcast update gets `apply-update`;
- after `rounds` broadcasts training is over: the first worker to apply the final update gets
  `terminate` (no hub to push to), and after it every `idle` does.

Late joiners (`joined` after round 0: `wait-for-model`, then `receive-model` from the next
worker to apply an update, which is told `send-model`) are played as section 5 says.

Deviation, on purpose: upstream's `batch-completed` branch adds `batch_size` (not
`batch_size x batches`) to the weight's numerator; here weights are the true shares, so they
sum to 1. Not thread-safe: the coordinator calls it under its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypha.accelerate_executor.local.scheduler import project

MULTI_BATCH_SIZE = 3
IDLE_S = 0.5
WAIT_FOR_MODEL_S = 1.0
RECEIVE_MODEL_S = 60.0
APPLY_UPDATE_S = 10.0


def system_time(seconds: float) -> dict[str, int]:
    whole = int(seconds)
    return {"secs_since_epoch": whole, "nanos_since_epoch": int((seconds - whole) * 1e9)}


def peers(ids: list[str], strategy: str) -> dict[str, Any]:
    return {"type": "peers", "peers": ids, "strategy": {"type": strategy}, "resource": None}


@dataclass
class _Worker:
    batch_size: int
    mean_ms: float | None = None
    timed: int = 0  # reports the mean is taken over
    clock_at: float | None = None  # when its clock was last reset or read, seconds
    samples: int = 0  # this round
    sent: bool = False  # this round
    applied: int = -1  # the last broadcast round it applied (or received the model of)
    waiting: bool = False  # a late joiner without the model yet
    sender: str | None = None  # who sends it the model


@dataclass
class ActionScheduler:
    target_samples: int
    rounds: int
    parameter_server: str
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    workers: dict[str, _Worker] = field(default_factory=dict)
    round: int = 0  # broadcasts so far
    round_samples: int = 0
    broadcast: bool = False  # an update is out that workers still apply
    finished_by: str | None = None  # the first worker that applied the final update

    def add_worker(self, peer: str, batch_size: int) -> None:
        self.workers[peer] = _Worker(batch_size)

    def remove_worker(self, peer: str) -> None:
        self.workers.pop(peer, None)

    @property
    def over(self) -> bool:
        return self.round >= self.rounds

    def senders(self) -> list[str]:
        """The workers a round's aggregation waits for: every one not waiting for a model."""
        return [peer for peer, worker in self.workers.items() if not worker.waiting]

    def broadcasted(self) -> None:
        """The parameter server pushed the round's update: the next round starts."""
        self.round += 1
        self.round_samples = 0
        self.broadcast = True
        for worker in self.workers.values():
            worker.samples, worker.sent = 0, False

    # Answers.

    def answer(self, peer: str, details: dict[str, Any]) -> dict[str, Any]:
        """The train action for `peer`'s status details."""
        worker = self.workers[peer]
        state = details["state"]
        if state == "joined":
            worker.clock_at = None
            if self.round == 0:
                return self._idle(IDLE_S)
            worker.waiting = True
            return {"kind": "wait-for-model", "timeout": self._deadline(WAIT_FOR_MODEL_S)}
        if state == "waited-for-model":
            if worker.sender is not None:
                return {
                    "kind": "receive-model",
                    "source": peers([worker.sender], "All"),
                    "timeout": self._deadline(RECEIVE_MODEL_S),
                }
            return {"kind": "wait-for-model", "timeout": self._deadline(WAIT_FOR_MODEL_S)}
        if state in ("received-model", "sent-model"):
            if state == "received-model":
                worker.waiting, worker.sender, worker.applied = False, None, self.round
            return self._idle(0.0)
        if state == "idle":
            return self._on_idle(peer, worker)
        if state == "batch-completed":
            return self._on_batch(peer, worker, int(details["batch_size"]), int(details["batches"]))
        if state == "sent-update":
            return self._idle(IDLE_S)
        if state == "applied-update":
            return self._on_applied(peer, worker)
        if state in ("pushed-to-hub", "terminated"):
            return {"kind": "terminate"}
        if state == "error":
            return self._idle(IDLE_S) if details["type"] == "connection" else {"kind": "terminate"}
        raise ValueError(f"unknown train state {state!r}")

    def _on_idle(self, peer: str, worker: _Worker) -> dict[str, Any]:
        if self.finished_by is not None:
            return {"kind": "terminate"}
        if self.broadcast and worker.applied < self.round and not worker.waiting:
            return {
                "kind": "apply-update",
                "source": peers([self.parameter_server], "All"),
                "timeout": self._deadline(APPLY_UPDATE_S),
            }
        if worker.sent or worker.waiting or self.over:
            return self._idle(IDLE_S)
        if self.round_samples < self.target_samples:
            return {"kind": "execute-batch", "batches": self._batches(peer)}
        return self._send_update(worker)

    def _on_batch(
        self, peer: str, worker: _Worker, batch_size: int, batches: int
    ) -> dict[str, Any]:
        now = self.clock()
        if batches > 0 and worker.clock_at is not None:
            per_batch_ms = (now - worker.clock_at) * 1e3 / batches
            worker.timed += 1
            previous = worker.mean_ms or 0.0
            worker.mean_ms = previous + (per_batch_ms - previous) / worker.timed
        worker.clock_at = now
        worker.samples += batch_size * batches
        self.round_samples += batch_size * batches
        if self.over or worker.sent:
            return self._idle(IDLE_S)
        if self.round_samples >= self.target_samples:
            return self._send_update(worker)
        return {"kind": "execute-batch", "batches": self._batches(peer)}

    def _on_applied(self, peer: str, worker: _Worker) -> dict[str, Any]:
        worker.applied = self.round
        worker.clock_at = self.clock()
        if all(w.applied >= self.round for w in self.workers.values() if not w.waiting):
            self.broadcast = False
        if self.over:
            if self.finished_by is None:
                self.finished_by = peer  # no hub: terminate instead of push-to-hub
                return {"kind": "terminate"}
            return self._idle(IDLE_S)
        joiner = next((p for p, w in self.workers.items() if w.waiting and w.sender is None), None)
        if joiner is not None:
            self.workers[joiner].sender = peer
            return {"kind": "send-model", "target": peers([joiner], "One")}
        return {"kind": "execute-batch", "batches": 1}

    def _send_update(self, worker: _Worker) -> dict[str, Any]:
        worker.sent = True
        weight = worker.samples / self.round_samples if self.round_samples else 0.0
        return {
            "kind": "send-update",
            "target": peers([self.parameter_server], "All"),
            "weight": weight,
        }

    def _batches(self, peer: str) -> int:
        """1 until every worker has a time; then its count in the simulation (may be 0)."""
        pool = list(self.workers.items())
        if any(worker.mean_ms is None for _, worker in pool):
            return 1
        now = self.clock()
        to_go = self.target_samples - self.round_samples
        projection = project(
            [round(((w.clock_at or now) - now) * 1e3) for _, w in pool],
            [w.batch_size for _, w in pool],
            [max(1, round(w.mean_ms or 1.0)) for _, w in pool],
            to_go,
            time_cap_ms=2**62,
            steps_cap=MULTI_BATCH_SIZE,
        )
        return projection.batches[[p for p, _ in pool].index(peer)]

    def _idle(self, seconds: float) -> dict[str, Any]:
        return {"kind": "idle", "timeout": self._deadline(seconds)}

    def _deadline(self, seconds: float) -> dict[str, int]:
        return system_time(self.wall() + seconds)
