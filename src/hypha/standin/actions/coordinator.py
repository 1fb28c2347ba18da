"""The action protocol's coordinator (docs/protocol-actions.md): the shared core
(coordinator/core.py) with the action-era scheduler (scheduler.py) answering each action
request, the broadcast of each round's update, late joiners sent a peer's model, and every
worker's global model compared after as many aggregates.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from hypha.accelerate_executor.protocol.actions.job import (
    ActionExecutorSpec,
    ActionJob,
    ActionTrainConfig,
)
from hypha.accelerate_executor.protocol.actions.messages import (
    ACTION_REQUEST,
    BatchCompletedStatus,
    ErrorStatus,
    SendModel,
    SentUpdateStatus,
    action_response,
)
from hypha.standin.actions.scheduler import ActionScheduler
from hypha.standin.backend import Push
from hypha.standin.console import warn
from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.coordinator.records import RoundRecord, WorkerRecord
from hypha.standin.data_service.service import Catalog
from hypha.standin.errors import CoordinatorRefusal
from hypha.standin.jobs import DESCRIPTOR, RunOptions, train_config, written

# The longest one `batch-completed` of the pool waits for a late joiner (_hold_for_joiners):
# well within the executor's 60 s request timeout.
JOINER_HOLD_S = 30.0


def job_spec(
    job_id: str, options: RunOptions, catalog: Catalog, scheduler_peer: str, parameter_server: str
) -> dict[str, Any]:
    """The job JSON for one worker: the action protocol names the peers in its actions, not
    in the job."""
    config = ActionTrainConfig.model_validate(train_config(options, catalog, scheduler_peer))
    executor = ActionExecutorSpec(class_="train", descriptor=DESCRIPTOR, config=config)
    return written(ActionJob(job_id=job_id, executor=executor))


class ActionCoordinator(CoordinatorCore):
    PLAYS = "the action protocol"
    COMPRESSED_SLICES = True
    WEIGHTED_MEAN = True
    build_job = staticmethod(job_spec)

    def __init__(self, catalog: Catalog, options: RunOptions, **core: Any) -> None:
        super().__init__(catalog, options, **core)
        self.actions = ActionScheduler(
            options.target_samples,
            options.rounds,
            self.parameter_server_peer,
            self.clock,
            wall=lambda: time.time() + options.scheduler_clock_skew_s,
            push_destination=self.push_destination,
        )
        # The peers the update being broadcast has yet to reach: the broadcast is over, and
        # the next round starts, once each bridge has taken the push (upstream's order) or
        # each has reported `applied-update` (options.broadcast_over).
        self._broadcast_to: set[str] = set()

    def _round(self) -> int:
        return self.actions.round

    # The core's hooks.

    def _joined(self, record: WorkerRecord) -> None:
        record.joined_round = self.actions.round
        self.actions.add_worker(record.peer_id, self.options.batch_size)

    def _left(self, record: WorkerRecord) -> None:
        self.actions.remove_worker(record.peer_id)
        self._reached(record.peer_id)

    def _waited_for(self, running: list[str]) -> list[str]:
        """One waiting for a model is not waited for, nor sent the update."""
        pool = set(self.actions.senders())
        return [job for job in running if self.workers[job].peer_id in pool]

    def _reported_sent(self, jobs: list[str]) -> list[str]:
        """Those whose `sent-update` has reached the scheduler."""
        return [job for job in jobs if self.workers[job].peer_id in self.actions.sent]

    def _aggregated(self) -> None:
        self.actions.aggregated()
        self._broadcast_to = {self.workers[job].peer_id for job in self._senders() or []}

    def _push_to_peer(self, record: WorkerRecord, peer: str, data: bytes) -> None:
        """A model for a late joiner, straight to its bridge."""
        target = next((job for job, w in self.workers.items() if w.peer_id == peer), None)
        if target is None:
            super()._push_to_peer(record, peer, data)
        elif not self.aggregation.forward(target, record.peer_id, data):
            raise CoordinatorRefusal(
                502, "connector_error", f"peer {peer} refused the push: no receive open"
            )

    def _took_push(self, record: WorkerRecord, push: Push) -> None:
        """The parameter server's push, in upstream's order, ends the broadcast once every
        target's bridge has it: upstream's send returns once its streams are delivered, and
        `broadcasted-update` follows at once (the parameter server executor, index id
        66485112720: its broadcast returning Ok is reported `broadcasted-update`), whether or
        not a receive was open for it."""
        if (
            push.from_peer == self.parameter_server_peer
            and self.options.broadcast_ends_when == "delivered"
        ):
            self._reached(record.peer_id)

    # Actions.

    def action(self, job_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """An ActionRequest of the job's executor (protocol/actions/messages.ACTION_REQUEST
        as JSON), answered as the action-era scheduler does."""
        with self._cond:
            record = self._record(job_id)
            try:
                message = ACTION_REQUEST.validate_python(request)
            except ValidationError:
                raise CoordinatorRefusal(400, "invalid_request", "not an action request") from None
            if message.job_id != job_id:
                raise CoordinatorRefusal(400, "invalid_request", "the request is for another job")
            status = message.status.details
            if isinstance(status, BatchCompletedStatus) and record.joined_round == 0:
                self._hold_for_joiners()
            if status.state in ("received-model", "error"):
                record.model_wait_over = True
            match status:
                case BatchCompletedStatus(batches=batches):
                    final_is_out = self.actions.aggregated_updates and (
                        self.actions.round >= self.options.rounds - 1
                    )
                    if final_is_out:
                        record.batches_past_end += batches
                    else:
                        record.batches_completed += batches
                    record.batches_unsent += batches
                case SentUpdateStatus(round=applied, metrics=sent):
                    self._sent_update(record, applied, sent)
                case ErrorStatus(type=kind, message=text):
                    warn(self.name, f"{record.name} reports {kind}: {text}")
            if status.state == "applied-update":
                if self.options.broadcast_ends_when == "applied":
                    self._reached(record.peer_id)
                record.round.received_at = time.time()
                record.rounds.append(RoundRecord(record.round.index + 1))
            action = self.actions.answer(record.peer_id, status)
            if isinstance(action, SendModel):
                # The joiner gets this worker's global model, with the aggregates it applied.
                applied_here = sum(r.received_at is not None for r in record.rounds)
                for joiner in self.workers.values():
                    if joiner.peer_id in action.target.peers:
                        joiner.model_base = record.model_base + applied_here
            # A late joiner that now waits for a model is no longer waited for.
            self.aggregation.maybe_start()
            return action_response(job_id, action)

    def _sent_update(self, record: WorkerRecord, applied: int, sent: dict[str, Any]) -> None:
        counted = int(sent.get("batches", record.batches_unsent))
        if counted != record.batches_unsent:
            self._violation(
                record,
                f"a sent-update counted {counted} batches; its batch-completed "
                f"statuses reported {record.batches_unsent} since the last one",
            )
        record.batches_sent += counted
        record.batches_unsent = 0
        self._close_rounds_applied_silently(record, applied)
        # Keyed by the scheduler's round, as upstream's metrics are: a late joiner's own
        # count starts at its first round.
        metrics = {key: float(value) for key, value in sent.items()}
        record.metrics[self.actions.round] = metrics
        if "global_digest" in metrics:
            self._compare_digest(record, record.model_base + applied, metrics["global_digest"])
        self._print_rounds()

    @staticmethod
    def _close_rounds_applied_silently(record: WorkerRecord, applied: int) -> None:
        """In upstream's order an aggregate is mostly applied without an `applied-update`
        (the executor applies it before its next action that trains): a `sent-update`'s
        round, the updates its sender has applied, closes the rounds that went unreported."""
        while sum(r.received_at is not None for r in record.rounds) < applied:
            record.round.received_at = time.time()
            record.rounds.append(RoundRecord(record.round.index + 1))

    def _hold_for_joiners(self) -> None:
        """Under the lock: a `batch-completed` of the pool waits, as on a slower network,
        while a late joiner is behind (_joiner_behind), at most JOINER_HOLD_S. Upstream's
        jobs run for thousands of batches, long enough for a joiner's executor to come up and
        get the model; a local run's few rounds can end first (upstream's scheduler sends a
        joiner the model only after its `joined`), and its joiner would show nothing."""
        deadline = time.monotonic() + JOINER_HOLD_S
        while self._joiner_behind() and time.monotonic() < deadline:
            self._cond.wait(0.2)

    def _joiner_behind(self) -> bool:
        """Under the lock: whether a late joiner that may still come is not yet where a
        short run needs it: from round 1 on its executor up (`joined`), from round 2 on
        holding the model (or past trying: an error ends the wait too)."""
        actions = self.actions
        if not self.options.late_workers or actions.round < 1:
            return False
        if self.cancelled is not None:
            return False
        if len(self.workers) < self.options.all_workers:
            return True  # not assigned yet
        for record in self.workers.values():
            if record.joined_round == 0 or record.exit_code is not None:
                continue
            if actions.workers[record.peer_id].joining:
                return True
            if actions.round >= 2 and not record.model_wait_over:
                return True
        return False

    def _compare_digest(self, record: WorkerRecord, aggregates: int, digest: float) -> None:
        """Each worker's global model after `aggregates` aggregates, as its `sent-update`'s
        `global_digest` states it, is the one every other worker held after as many: each
        applied every aggregate, once, in order. Keyed by the aggregates, not the
        scheduler's round: an update that missed its round's aggregate is reported in the
        next round with the model of the one before. A difference is warned of and listed
        in the summary (report.py fails the run on it)."""
        record.digests[aggregates] = digest
        for other in self.workers.values():
            theirs = other.digests.get(aggregates)
            if other is not record and theirs is not None and theirs != digest:
                text = (
                    f"{record.name}'s global model after {aggregates} aggregate(s) (digest "
                    f"{int(digest):06x}) differs from {other.name}'s ({int(theirs):06x})"
                )
                self.digest_mismatches.append(text)
                warn(self.name, text)
                return

    def _reached(self, peer: str) -> None:
        """The broadcast reached `peer` (or it left): the last one ends the broadcast, before
        its own `applied-update` is answered, as upstream's parameter server reports the
        end of its send before the last receiver has loaded the update."""
        if peer in self._broadcast_to:
            self._broadcast_to.discard(peer)
            if not self._broadcast_to:
                # An update that missed this aggregate is the next one's: its sender's
                # `sent-update` stays recorded, so it is not asked to send again.
                carried = {self.workers[job].peer_id for job in self.aggregation.pending_jobs()}
                self.actions.broadcasted(keep_sent=carried)
                self._cond.notify_all()
