"""The action-era train scheduler's answers (docs/protocol-actions.md section 4), decided as
upstream's `crates/scheduler/src/scheduling/rl_scheduler.rs` (index id 66469012466) and the
train scheduler with `execute-batch{batches}` whose tests tests/unit/standin replays
(`batch_scheduler.rs`, index id 66542311247) decide them, with their `statistics.rs`
(index id 66460343894) and `simulation.rs` (index id 66551745366):

- each `batch-completed` adds `batch_size x batches` samples to the round's count and the
  worker's share; a worker's per-batch time is a running mean in whole milliseconds,
  weighted by `batches`, of the time since its last report (the first report,
  `applied-update` and `batches: 0` only move its clock);
- `batches` is 1 until every pool member has a mean; then every worker is played forward at
  its mean until the round's samples run out or one reaches `multi_batch_size`, and the
  reporter gets its own count, which may be 0;
- once the count reaches the target, `send-update{weight}` to the primary parameter server
  (strategy One); the weight's numerator is upstream's: on `idle` the worker's samples, on
  `batch-completed` its samples before that report plus one `batch_size`;
- the parameter server's side (`aggregated`, `broadcasted`) opens and closes the window in
  which an `idle` from a worker that has not applied the update gets `apply-update`;
- after `rounds` broadcasts training is over: the first worker to have applied the final
  update is told to push (terminate, with no destination), and every `idle` after that gets
  `terminate`.

Late joiners: `joined` after round 0 -> `wait-for-model`, and the joiner waits for the
model from then on; the next worker to report `applied-update` is told `send-model` to it
(which ends its waiting), and its next `waited-for-model` gets `receive-model` from that
worker. A joiner whose executor comes up after the last such `applied-update` gets no model:
it is told `terminate` once the final model is pushed.

Statuses and actions are the executor's declarations (protocol/actions/messages.py), the shapes its
client writes and reads. Not thread-safe: the coordinator calls it under its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
from hypha.accelerate_executor.protocol.actions.messages import (
    Action,
    ApplyUpdate,
    BatchCompletedStatus,
    ErrorStatus,
    ExecuteBatch,
    Idle,
    PushToHub,
    ReceiveModel,
    SendModel,
    SendUpdate,
    Status,
    Terminate,
    WaitForModel,
)
from hypha.accelerate_executor.protocol.job import Strategy

MULTI_BATCH_SIZE = 3
SHORT_IDLE_S = 0.5
WAIT_FOR_MODEL_S = 1.0
LONG_IO_S = 60.0
APPLY_UPDATE_S = 10.0
UNSET_MEAN = 2**64 - 1  # statistics.rs: a mean with no sample yet is u64::MAX


def peers(ids: list[str], strategy: Literal["All", "One"]) -> ActionPeersReference:
    return ActionPeersReference(type="peers", peers=ids, strategy=Strategy(type=strategy))


def _div_toward_zero(numerator: int, denominator: int) -> int:
    """Rust's integer division (i64), which truncates toward zero."""
    quotient = abs(numerator) // abs(denominator)
    return quotient if (numerator >= 0) == (denominator > 0) else -quotient


@dataclass
class RunningMean:
    """Milliseconds per batch, weighted by the batches of each sample (statistics.rs)."""

    value: int = UNSET_MEAN
    samples: int = 0

    def update(self, time_ms: int, count: int) -> None:
        if count <= 0:
            return
        if self.samples == 0:
            self.value, self.samples = time_ms // count, count
            return
        self.samples += count
        self.value += _div_toward_zero(time_ms // count - self.value, self.samples)


@dataclass(frozen=True)
class Simulation:
    time_ms: int
    to_go: int  # negative when the last batches overshoot the target
    batches: list[int]
    capped: bool


def simulate(
    progress_ms: Sequence[int],
    batch_sizes: Sequence[int],
    means_ms: Sequence[int],
    to_go: int,
    steps_cap: int,
) -> Simulation:
    """Plays every worker forward from its last report at its mean until `to_go` samples are
    trained or one worker reaches `steps_cap` batches (simulation.rs, no time cap)."""
    batches = [0] * len(batch_sizes)
    next_ms = [last + mean for last, mean in zip(progress_ms, means_ms, strict=True)]
    now, capped = 0, False
    while to_go > 0 and next_ms:
        now = min(next_ms)
        # Workers finishing at the same moment count together (upstream's min_set).
        for index in [i for i, at in enumerate(next_ms) if at == now]:
            to_go -= batch_sizes[index]
            batches[index] += 1
            capped = capped or batches[index] >= steps_cap
            next_ms[index] += means_ms[index]
        if capped:
            break
    return Simulation(now, to_go, batches, capped)


@dataclass
class _Worker:
    """A trainer pool member's info (upstream's pool TrainInfo and statistics)."""

    batch_size: int
    mean: RunningMean = field(default_factory=RunningMean)
    last_updated_ms: int | None = None
    samples: int = 0  # this round
    applied_update: bool = False
    applied_final_update: bool = False
    waiting_for_model: bool = False
    # Assigned after round 0, its executor not yet up (no `joined`): a round does not wait
    # for it (below), and it is not sent a model it has no receive open for.
    joining: bool = False
    receiving_from: str | None = None
    is_pusher: bool = False
    push_failed: bool = False


@dataclass
class ActionScheduler:
    target_samples: int
    rounds: int
    parameter_server: str | None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    multi_batch_size: int = MULTI_BATCH_SIZE
    # (repository, token) to push the final model to; None: terminate instead.
    push_destination: tuple[str, str] | None = None
    workers: dict[str, _Worker] = field(default_factory=dict)  # pool order: oldest first
    round: int = 0
    count: int = 0  # samples this round
    sent: set[str] = field(default_factory=set)  # the primary parameter server's worker_updates
    aggregated_updates: bool = False
    training_complete: bool = False
    push_done: bool = False

    def __post_init__(self) -> None:
        self._start = self.clock()

    def add_worker(self, peer: str, batch_size: int) -> None:
        """A new pool member. One that comes after round 0 is `joining` until its `joined`:
        upstream's rounds wait for it until the quorum's grace time has passed, and the
        stand-in's parameter server, which plays that quorum too
        (parameter_server/aggregation.py), leaves it out at once instead."""
        self.workers[peer] = _Worker(batch_size, joining=self.round > 0)

    def remove_worker(self, peer: str) -> None:
        self.workers.pop(peer, None)

    # The parameter server's side.

    def senders(self) -> list[str]:
        """Whom an aggregation waits for: every pool worker not waiting for a model."""
        return [
            peer
            for peer, worker in self.workers.items()
            if not (worker.waiting_for_model or worker.joining)
        ]

    def aggregated(self) -> list[str]:
        """The update is ready (`aggregated-updates`): `idle`s get `apply-update` until the
        broadcast is over. Returns the broadcast's targets: the whole pool."""
        self.aggregated_updates = True
        for worker in self.workers.values():
            worker.applied_update = False
        return list(self.workers)

    def broadcasted(self, keep_sent: set[str] | frozenset[str] = frozenset()) -> None:
        """Every target has the update (`broadcasted-update`): the next round starts.
        `keep_sent`: the senders whose update missed this aggregate and goes into the next."""
        for worker in self.workers.values():
            worker.samples = 0
        self.sent &= set(keep_sent)
        self.round += 1
        self.training_complete = self.training_complete or self.round >= self.rounds
        if self.training_complete:
            # Every worker that applied it has the final model: each may be asked to push,
            # the next one when a push fails.
            for worker in self.workers.values():
                worker.applied_final_update = worker.applied_final_update or worker.applied_update
        self.count = 0
        if not self.training_complete:
            self.aggregated_updates = False

    # Answers.

    def answer(self, peer: str, status: Status) -> Action:
        """The train action for `peer`'s status."""
        worker = self.workers[peer]
        match status:
            case BatchCompletedStatus(batch_size=batch_size, batches=batches):
                return self._on_batch(peer, worker, batch_size, batches)
            case ErrorStatus(type=kind):
                worker.push_failed = worker.push_failed or worker.is_pusher
                worker.is_pusher = False
                return self._idle(SHORT_IDLE_S) if kind == "connection" else Terminate()
        state = status.state
        if state == "joined":
            worker.joining = False
            if self.round == 0:
                return self._idle(SHORT_IDLE_S)
            worker.waiting_for_model = True
            return WaitForModel(self._deadline(WAIT_FOR_MODEL_S))
        if state == "waited-for-model":
            if self.push_done:
                # Upstream's scheduler cancels the job once the model is pushed, which ends
                # a joiner still waiting; the stand-in answers it `terminate` instead.
                return Terminate()
            sender, worker.receiving_from = worker.receiving_from, None
            if sender is not None:
                return ReceiveModel(peers([sender], "All"), self._deadline(LONG_IO_S))
            return WaitForModel(self._deadline(WAIT_FOR_MODEL_S))
        if state in ("received-model", "sent-model"):
            return self._idle(0.0)
        if state == "idle":
            return self._on_idle(peer, worker)
        if state == "sent-update":
            self.sent.add(peer)
            return self._idle(SHORT_IDLE_S)
        if state == "applied-update":
            return self._on_applied(peer, worker)
        if state == "pushed-to-hub":
            self.push_done = self.push_done or worker.is_pusher
        return Terminate()  # pushed-to-hub, terminated

    def _on_idle(self, peer: str, worker: _Worker) -> Action:
        if self.training_complete and self.push_done:
            return Terminate()
        if self.aggregated_updates and not worker.applied_update:
            return ApplyUpdate(
                peers(self._parameter_servers(), "All"), self._deadline(APPLY_UPDATE_S)
            )
        if self.training_complete:
            if not any(w.applied_final_update and not w.push_failed for w in self.workers.values()):
                return Terminate()  # every worker with the final model failed to push it
            if (
                worker.applied_final_update
                and not worker.push_failed
                and not any(w.is_pusher for w in self.workers.values())
            ):
                worker.is_pusher = True
                if self.push_destination is None:
                    self.push_done = True
                    return Terminate()
                return PushToHub(*self.push_destination)
            return self._idle(SHORT_IDLE_S)
        if peer in self.sent:
            return self._idle(SHORT_IDLE_S)
        return self._train_or_send(peer, worker.samples)

    def _on_batch(self, peer: str, worker: _Worker, batch_size: int, batches: int) -> Action:
        now_ms = self._since_start_ms()
        if worker.last_updated_ms:  # upstream: only once its clock is past 0
            worker.mean.update(max(0, now_ms - worker.last_updated_ms), batches)
        worker.last_updated_ms = now_ms
        contribution = worker.samples + batch_size  # upstream's numerator, as it is
        self.count += batch_size * batches
        worker.samples += batch_size * batches
        if self.training_complete or peer in self.sent:
            return self._idle(SHORT_IDLE_S)
        return self._train_or_send(peer, contribution)

    def _on_applied(self, peer: str, worker: _Worker) -> Action:
        worker.applied_update = True
        # The update's time is not a batch's: the clock starts again from here.
        worker.last_updated_ms = self._since_start_ms()
        if self.training_complete:
            worker.applied_final_update = True
            return self._idle(SHORT_IDLE_S)
        joiner = next((p for p, w in self.workers.items() if w.waiting_for_model), None)
        if joiner is not None:
            self.workers[joiner].waiting_for_model = False
            self.workers[joiner].receiving_from = peer
            return SendModel(peers([joiner], "One"))
        return ExecuteBatch(1)

    def _train_or_send(self, peer: str, contribution: int) -> Action:
        if self.count < self.target_samples:
            return ExecuteBatch(self._batches(peer))
        servers = self._parameter_servers()
        if not servers:
            return self._idle(SHORT_IDLE_S)  # nobody to send to: wait for a parameter server
        return SendUpdate(peers(servers[:1], "One"), contribution / self.count)

    def _batches(self, peer: str) -> int:
        """1 until every pool member has a mean; then its count in the simulation. A member
        whose update is already in (one that missed the last aggregate, carried into this
        round) trains no more this round: played forward, its stale clock would take every
        batch left, and the others would be told `execute-batch{0}` for ever."""
        members = [p for p in self.workers if p not in self.sent or p == peer]
        pool = [self.workers[p] for p in members]
        means = [w.mean.value for w in pool]
        if not pool or not all(0 < mean < UNSET_MEAN for mean in means):
            return 1
        simulation = simulate(
            [w.last_updated_ms or 0 for w in pool],
            [w.batch_size for w in pool],
            means,
            self.target_samples - self.count,
            self.multi_batch_size,
        )
        return simulation.batches[members.index(peer)]

    def _parameter_servers(self) -> list[str]:
        return [] if self.parameter_server is None else [self.parameter_server]

    def _since_start_ms(self) -> int:
        return int((self.clock() - self._start) * 1000)

    def _idle(self, seconds: float) -> Idle:
        return Idle(self._deadline(seconds))

    def _deadline(self, seconds: float) -> float:
        """`seconds` from now, since the epoch."""
        return self.wall() + seconds
