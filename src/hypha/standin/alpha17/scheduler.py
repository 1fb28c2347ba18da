"""The scheduler's answers to progress messages, decided as Hypha's batch scheduler decides.

Read off upstream's `batch_scheduler.rs`, `tracker/progress.rs`, `tracker/worker.rs`,
`statistics.rs` and `simulation.rs`:

- a round has a sample target; every `status` subtracts its `batch_size` from it;
- the time between two statuses of a worker (from the round's start, for its first) is one
  batch of that worker's job batch size, kept as a running mean per worker over the job,
  in whole milliseconds;
- on each status the scheduler projects, from those means, how many more batches each
  worker trains until the target is reached; only when that ends within 10 s of the round's
  start and before any worker's third batch does the sender get `ScheduleUpdate{its
  projected batches}`, else `Continue`. Once the target is reached, that is
  `ScheduleUpdate{0}`;
- `update` -> Ok; a `status` while the update is in flight -> Error; the parameter server's
  `updated` starts the next round; `update-received` -> Continue, or Done after the last.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    Done,
    Ok,
    SchedulerAnswer,
    ScheduleUpdate,
)
from hypha.standin.errors import ProgressError

TIME_CAP_MS = 10_000
STEPS_CAP = 3


class State(Enum):
    TRAINING = "training"
    UPDATE_SCHEDULED = "update-scheduled"
    UPDATING = "updating"
    DONE = "done"


@dataclass(frozen=True)
class Projection:
    """Where the simulation stopped: its time (ms from the round's start), the samples
    still to go, each worker's batches until then, and whether a cap stopped it."""

    time_ms: int
    to_go: int
    batches: list[int]
    capped: bool


def project(
    last_ms: Sequence[int],
    batch_sizes: Sequence[int],
    estimates_ms: Sequence[int],
    to_go: int,
    time_cap_ms: int = TIME_CAP_MS,
    steps_cap: int = STEPS_CAP,
) -> Projection:
    """Plays the workers forward, each finishing a batch every `estimates_ms` after its
    last status, until `to_go` samples are trained or a cap is hit."""
    batches = [0] * len(batch_sizes)
    next_ms = [last + estimate for last, estimate in zip(last_ms, estimates_ms, strict=True)]
    now = 0
    while to_go > 0 and next_ms:
        event = min(next_ms)
        if event >= time_cap_ms:
            return Projection(now, to_go, batches, True)
        now = event
        capped = False
        # Workers finishing at the same moment count together, as upstream's min_set does.
        for index, at in enumerate(next_ms):
            if at != event:
                continue
            to_go = max(0, to_go - batch_sizes[index])
            batches[index] += 1
            capped = capped or batches[index] >= steps_cap
            next_ms[index] += estimates_ms[index]
        if capped:
            return Projection(now, to_go, batches, True)
    return Projection(now, to_go, batches, False)


@dataclass
class RunningMean:
    """Upstream's RunningMean: integer milliseconds, its first sample taken as it is."""

    value: int = 0
    samples: int = 0

    def update(self, sample_ms: int) -> None:
        self.samples += 1
        # Rust's integer division truncates toward zero.
        self.value = (
            sample_ms
            if self.samples == 1
            else self.value + int((sample_ms - self.value) / self.samples)
        )


@dataclass
class Tracked:
    batch_size: int
    last_ms: int = 0
    interval: RunningMean = field(default_factory=RunningMean)
    state: State = State.TRAINING


class BatchScheduler:
    """The state machine of one job's DiLoCo rounds over its workers (by peer id).

    Not thread-safe: the coordinator calls it under its lock. `clock` gives seconds."""

    def __init__(
        self,
        samples_per_round: int,
        rounds: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.samples_per_round = samples_per_round
        self.rounds = rounds
        self.count = samples_per_round
        self.round = 0
        self._clock = clock
        self._round_started = clock()
        self._workers: dict[str, Tracked] = {}

    def add_worker(self, peer: str, batch_size: int) -> None:
        self._workers[peer] = Tracked(batch_size)

    def remove_worker(self, peer: str) -> None:
        """A worker that is gone no longer counts in the projection."""
        self._workers.pop(peer, None)

    def state(self, peer: str) -> State:
        return self._tracked(peer).state

    def status(self, peer: str, batch_size: int) -> SchedulerAnswer:
        tracked = self._tracked(peer)
        # Counted and timed whatever the state, as upstream's tracker.update comes first.
        self.count = max(0, self.count - batch_size)
        now_ms = int((self._clock() - self._round_started) * 1000)
        tracked.interval.update(now_ms - tracked.last_ms)
        tracked.last_ms = now_ms
        if tracked.state is State.UPDATE_SCHEDULED:
            return Continue()
        if tracked.state is not State.TRAINING:
            raise ProgressError(f"status while {tracked.state.value}")
        peers = list(self._workers)
        projection = project(
            [self._workers[p].last_ms for p in peers],
            [self._workers[p].batch_size for p in peers],
            [self._workers[p].interval.value for p in peers],
            self.count,
        )
        if projection.to_go == 0 and not projection.capped:
            tracked.state = State.UPDATE_SCHEDULED
            return ScheduleUpdate(projection.batches[peers.index(peer)])
        return Continue()

    def update(self, peer: str) -> SchedulerAnswer:
        self._tracked(peer).state = State.UPDATING
        return Ok()

    def updated(self) -> None:
        """The parameter server has pushed the round's update: the next round begins."""
        self.count = self.samples_per_round
        self.round += 1
        self._round_started = self._clock()
        for tracked in self._workers.values():
            tracked.last_ms = 0
            tracked.state = State.TRAINING

    @property
    def finished(self) -> bool:
        return self.round >= self.rounds

    def update_received(self, peer: str) -> SchedulerAnswer:
        tracked = self._tracked(peer)
        if self.finished:
            tracked.state = State.DONE
            return Done()
        tracked.state = State.TRAINING
        return Continue()

    def _tracked(self, peer: str) -> Tracked:
        tracked = self._workers.get(peer)
        if tracked is None:
            raise ProgressError(f"no worker {peer} in this job")
        return tracked
