"""The Hypha side of a local cluster, in one process for N workers: what the coordinator does.

It assigns jobs and ties the parts together under one lock: the scheduler
(scheduler/), the model store and data service (data_service/service.py), the parameter
server (parameter_server/), and the records of the run (records.py). Workers' bridges reach
it over TCP (server.py serves its HTTP face, http_api.py, which client.py calls), or by
direct calls when they run in this process
(InProcessBackend).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import ValidationError

from hypha.accelerate_executor.bridge.actions import (
    ACTION_REQUEST,
    BatchCompletedStatus,
    ErrorStatus,
    SendModel,
    SentUpdateStatus,
    action_response,
)
from hypha.accelerate_executor.bridge.bodies import (
    PROGRESS,
    MetricsBody,
    MetricsProgress,
    Progress,
    StatusBody,
    StatusProgress,
)
from hypha.accelerate_executor.bridge.client import (
    Continue,
    Error,
    Ok,
    SchedulerAnswer,
    ScheduleUpdate,
    answer_body,
)
from hypha.accelerate_executor.errors import BackendError, CoordinatorRefusal, ProgressError
from hypha.standin.backend import ERROR_KINDS, Push, RemoteFile
from hypha.standin.console import say, warn
from hypha.standin.coordinator.records import RoundRecord, WorkerRecord
from hypha.standin.data_service.service import Catalog, DataService
from hypha.standin.job_status import last_line
from hypha.standin.jobs import RunOptions, job_spec, new_peer_id
from hypha.standin.parameter_server.aggregation import Aggregation
from hypha.standin.parameter_server.server import NesterovOuterOptimizer
from hypha.standin.scheduler.action_scheduler import ActionScheduler
from hypha.standin.scheduler.batch_scheduler import BatchScheduler, State

# The longest one `batch-completed` of the pool waits for a late joiner (_hold_for_joiners):
# well within the executor's 60 s request timeout.
JOINER_HOLD_S = 30.0


class CoordinatorCore:
    def __init__(
        self,
        catalog: Catalog,
        options: RunOptions,
        *,
        name: str = "coordinator",
        clock: Callable[[], float] = time.monotonic,
        push_destination: tuple[str, str] | None = None,
    ) -> None:
        """`clock` (seconds) times the statuses the scheduler projects from;
        `push_destination` (repository, token) is the job's `model_destination`, which the
        action-era scheduler pushes the final model to."""
        self.catalog = catalog
        self.options = options
        self.name = name
        self.scheduler_peer = new_peer_id()
        self.parameter_server_peer = new_peer_id()
        self.started_at = time.time()
        self.cancelled: str | None = None
        self.workers: dict[str, WorkerRecord] = {}  # by job id
        actions = options.generation == "actions"
        self.data = DataService(catalog, self.scheduler_peer, compressed=actions)
        self.scheduler = BatchScheduler(options.target_samples, options.rounds, clock)
        # The action-era scheduler (docs/protocol-actions.md section 4), when played.
        self.actions: ActionScheduler | None = None
        if actions:
            self.actions = ActionScheduler(
                options.target_samples,
                options.rounds,
                self.parameter_server_peer,
                clock,
                wall=lambda: time.time() + options.scheduler_clock_skew_s,
                push_destination=push_destination,
            )
        # The peers the update being broadcast has yet to reach (action era): the broadcast
        # is over, and the next round starts, once each bridge has taken the push
        # (upstream's order) or each has reported `applied-update` (options.broadcast_over).
        self._broadcast_to: set[str] = set()
        self._cond = threading.Condition()
        self.aggregation = Aggregation(
            NesterovOuterOptimizer(
                options.outer_learning_rate, options.outer_momentum, weighted=actions
            ),
            self.parameter_server_peer,
            self._cond,
            senders=self._senders,
            closed=self._round_closed,
            failed=self.cancel,
            reported=self._reported_sent,
            quorum=options.quorum,
            grace_s=options.grace_s,
            clock=clock,
            rounds=options.rounds,
        )
        self._printed_rounds: set[int] = set()
        self.digest_mismatches: list[str] = []  # action era, see _compare_digest
        self.refused_broadcasts: list[str] = []  # action era, see settle_push

    def cancel(self, reason: str) -> None:
        """Cancels every job: the workers see it and stop their executors (SIGTERM)."""
        with self._cond:
            if self.cancelled is None:
                self.cancelled = reason
                warn(self.name, f"cancelling all jobs: {reason}")
            self._cond.notify_all()

    def wait_finished(self, timeout_s: float | None = None) -> bool:
        """Waits until every worker's job has been assigned and has ended."""
        with self._cond:
            return self._cond.wait_for(self.finished, timeout_s)

    def wait_for_round(self, index: int, timeout_s: float | None = None) -> bool:
        """Action era: waits until round `index` has begun (its previous one broadcast);
        False if the run was cancelled or ended first."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self.cancelled is not None
                    or self.finished()
                    or (self.actions is not None and self.actions.round >= index)
                ),
                timeout_s,
            )
            return self.actions is not None and self.actions.round >= index

    def finished(self) -> bool:
        return len(self.workers) == self.options.all_workers and all(
            worker.exit_code is not None for worker in self.workers.values()
        )

    # Jobs.

    def assign_job(self, worker_name: str) -> dict[str, Any]:
        with self._cond:
            if any(worker.name == worker_name for worker in self.workers.values()):
                raise CoordinatorRefusal(
                    409, "invalid_request", f"worker {worker_name!r} already had its job"
                )
            if len(self.workers) >= self.options.all_workers:
                raise CoordinatorRefusal(
                    409, "invalid_request", f"all {self.options.all_workers} jobs are assigned"
                )
            if self.cancelled is not None:
                raise CoordinatorRefusal(
                    409, "invalid_request", f"the run is cancelled: {self.cancelled}"
                )
            record = WorkerRecord(worker_name, new_peer_id(), str(uuid.uuid4()), time.time())
            if self.actions is not None:
                record.joined_round = self.actions.round
            self.workers[record.job_id] = record
            self.scheduler.add_worker(record.peer_id, self.options.batch_size)
            if self.actions is not None:
                self.actions.add_worker(record.peer_id, self.options.batch_size)
        say(
            self.name,
            f"job {record.job_id} -> {worker_name} ({len(self.workers)}/{self.options.all_workers})",
        )
        return self.job_spec(record.job_id)

    def job_spec(self, job_id: str) -> dict[str, Any]:
        return job_spec(
            job_id, self.options, self.catalog, self.scheduler_peer, self.parameter_server_peer
        )

    def job_state(self, job_id: str) -> dict[str, Any]:
        with self._cond:
            self._record(job_id)
            if self.cancelled is not None:
                return {"state": "cancelled", "reason": self.cancelled}
            return {"state": "running"}

    def backend(self, job_id: str) -> InProcessBackend:
        """The job's bridge backend for a worker in this process (see InProcessBackend)."""
        return InProcessBackend(self, job_id)

    def _record(self, job_id: str) -> WorkerRecord:
        record = self.workers.get(job_id)
        if record is None:
            raise CoordinatorRefusal(404, "connector_error", f"no job {job_id}")
        return record

    # Data service and model store.

    def fetch(self, job_id: str, reference: dict[str, Any]) -> list[dict[str, str]]:
        with self._cond:
            record = self._record(job_id)
            files, index = self.data.fetch(record.peer_id, reference)
            if index is not None:
                record.slices.append(index)
            return files

    def blob_path(self, blob: str) -> Path:
        with self._cond:
            return self.data.blob_path(blob)

    # Scheduler.

    def status(self, job_id: str, progress: Any) -> dict[str, Any]:
        """A Progress message (bridge/bodies.PROGRESS as JSON), answered as alpha.17's
        scheduler does."""
        with self._cond:
            record = self._record(job_id)
            try:
                message = PROGRESS.validate_python(progress)
            except ValidationError:
                raise CoordinatorRefusal(400, "invalid_request", "not a progress message") from None
            try:
                return answer_body(self._answer(record, message, time.time()))
            except ProgressError as exc:
                self._violation(record, str(exc))
                return answer_body(Error())

    def _answer(self, record: WorkerRecord, progress: Progress, now: float) -> SchedulerAnswer:
        current, peer = record.round, record.peer_id
        match progress:
            case StatusProgress(status=StatusBody(batch_size=samples)):
                if self.scheduler.state(peer) is State.TRAINING and current.update_at is not None:
                    self._violation(
                        record, f"status before update-received in round {current.index}"
                    )
                answer = self.scheduler.status(peer, samples)
                current.batches += 1
                current.samples += samples
                if current.first_status_at is None:
                    current.first_status_at, current.first_batch_samples = now, samples
                if isinstance(answer, ScheduleUpdate):
                    current.scheduled_at_batch, current.counter = current.batches, answer.counter
                return answer
            case MetricsProgress(metrics=MetricsBody(round=round_number, metrics=sent)):
                metrics = {key: float(value) for key, value in sent.items()}
                record.metrics[round_number] = metrics
                if "batches" in metrics:
                    current.trained_batches = int(metrics["batches"])
                self._print_rounds()
                return Ok()
        if progress == "update":
            if current.update_at is not None:
                self._violation(record, f"a second update in round {current.index}")
            elif current.scheduled_at_batch is None:
                self._violation(record, f"update in round {current.index} before ScheduleUpdate")
            current.update_at = now
            return self.scheduler.update(peer)
        if progress == "update-received":
            if current.aggregated_at is None:
                self._violation(
                    record, f"update-received in round {current.index} before the update was pushed"
                )
            current.received_at = now
            answer = self.scheduler.update_received(peer)
            if isinstance(answer, Continue):
                record.rounds.append(RoundRecord(current.index + 1))
            return answer
        return Ok()  # updated

    @staticmethod
    def _close_rounds_applied_silently(record: WorkerRecord, applied: int) -> None:
        """In upstream's order an aggregate is mostly applied without an `applied-update`
        (the executor applies it before its next action that trains): a `sent-update`'s
        round, the updates its sender has applied, closes the rounds that went unreported."""
        while sum(r.received_at is not None for r in record.rounds) < applied:
            record.round.received_at = time.time()
            record.rounds.append(RoundRecord(record.round.index + 1))

    def action(self, job_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """An ActionRequest of the job's executor (bridge/actions.ACTION_REQUEST as JSON),
        answered as the action-era scheduler does."""
        with self._cond:
            record = self._record(job_id)
            if self.actions is None:
                raise CoordinatorRefusal(404, "connector_error", "this run plays alpha.17")
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
                    # Keyed by the scheduler's round, as upstream's metrics are: a late
                    # joiner's own count starts at its first round.
                    metrics = {key: float(value) for key, value in sent.items()}
                    record.metrics[self.actions.round] = metrics
                    if "global_digest" in metrics:
                        self._compare_digest(
                            record, record.model_base + applied, metrics["global_digest"]
                        )
                    self._print_rounds()
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
        if actions is None or not self.options.late_workers or actions.round < 1:
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

    def _violation(self, record: WorkerRecord, what: str) -> None:
        record.violations.append(what)
        warn(self.name, f"{record.name} broke the protocol: {what}")

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
            if not self._broadcast_to and self.actions is not None:
                # An update that missed this aggregate is the next one's: its sender's
                # `sent-update` stays recorded, so it is not asked to send again.
                carried = {self.workers[job].peer_id for job in self.aggregation.pending_jobs()}
                self.actions.broadcasted(keep_sent=carried)
                self._cond.notify_all()

    def _print_rounds(self) -> None:
        """Prints each round's losses once every running worker has reported them (a late
        joiner from the round it joined)."""
        if len(self.workers) < self.options.workers:
            return
        reported = sorted(
            {key for worker in self.workers.values() for key in worker.metrics}
            - self._printed_rounds
        )
        for key in reported:
            workers = self.workers.values()
            if any(
                key not in w.metrics and w.exit_code is None and w.joined_round <= key
                for w in workers
            ):
                return
            losses = {
                w.name: w.metrics[key]["loss"] for w in workers if "loss" in w.metrics.get(key, {})
            }
            self._printed_rounds.add(key)
            if losses:
                mean = sum(losses.values()) / len(losses)
                parts = "  ".join(f"{name} {loss:.3f}" for name, loss in sorted(losses.items()))
                say(self.name, f"round {key}: loss {parts}  mean {mean:.3f}")

    # Parameter server.

    def push(self, job_id: str, peer: str, data: bytes) -> None:
        with self._cond:
            record = self._record(job_id)
            if peer != self.parameter_server_peer:
                # Action era: a model for a late joiner, straight to its bridge.
                target = next((job for job, w in self.workers.items() if w.peer_id == peer), None)
                if self.actions is None or target is None:
                    raise CoordinatorRefusal(502, "network_error", f"peer {peer} is not reachable")
                if not self.aggregation.forward(target, record.peer_id, data):
                    raise CoordinatorRefusal(
                        502, "connector_error", f"peer {peer} refused the push: no receive open"
                    )
                return
            if not self.aggregation.submit(job_id, data):
                self._violation(record, f"a second pseudo-gradient in round {record.round.index}")

    def _senders(self) -> list[str] | None:
        """The jobs a round waits for: every running one, once every worker has joined (in
        the action era, one waiting for a model is not waited for, nor sent the update)."""
        if len(self.workers) < self.options.workers:
            return None
        running = [job for job, worker in self.workers.items() if worker.exit_code is None]
        if self.actions is None:
            return running
        pool = set(self.actions.senders())
        return [job for job in running if self.workers[job].peer_id in pool]

    def _reported_sent(self, jobs: list[str]) -> list[str]:
        """Under the lock: those of `jobs` whose `sent-update` has reached the scheduler."""
        if self.actions is None:
            return jobs  # alpha.17: every worker's update is waited for
        return [job for job in jobs if self.workers[job].peer_id in self.actions.sent]

    def _round_closed(self, aggregation: dict[str, Any]) -> None:
        """Under the lock: the update is out, so the scheduler starts the next round."""
        aggregation["workers"] = sorted(self.workers[job].name for job in aggregation["jobs"])
        now = time.time()
        for worker in self.workers.values():
            if worker.exit_code is None:
                worker.round.aggregated_at = now
        self.scheduler.updated()
        if self.actions is not None:
            self.actions.aggregated()
            self._broadcast_to = {self.workers[job].peer_id for job in self._senders() or []}
        if aggregation["skipped_tensors"]:
            skipped = ", ".join(aggregation["skipped_tensors"])
            warn(self.name, f"round {aggregation['round']}: left out {skipped}")

    def next_push(self, job_id: str, after: int, wait_s: float) -> Push | None:
        """The job's bridge takes its next push. The parameter server's, in upstream's
        order, ends the broadcast once every target's bridge has it: upstream's send
        returns once its streams are delivered, and `broadcasted-update` follows at once
        (the parameter server executor, index id 66485112720: its broadcast returning Ok
        is reported `broadcasted-update`), whether or not a receive was open for it."""
        with self._cond:
            record = self._record(job_id)
            push = self.aggregation.next_push(job_id, after, wait_s)
            if (
                push is not None
                and push.from_peer == self.parameter_server_peer
                and self.options.broadcast_ends_when == "delivered"
            ):
                self._reached(record.peer_id)
            return push

    def settle_push(self, job_id: str, seq: int, taken: bool) -> None:
        """The job's bridge took or refused its push `seq`. A refused aggregate fails the
        run: upstream's worker refuses it the same way, and there the refusal ends the
        parameter server's whole broadcast and, after a second aggregation that finds nothing
        to aggregate, its job (docs/protocol-actions.md: "A push with no receive open")."""
        with self._cond:
            record = self._record(job_id)
            refused_round = self.aggregation.settle(job_id, seq, taken)
            if refused_round is not None:
                text = (
                    f"{record.name}'s bridge refused round {refused_round}'s aggregate: no "
                    "receive was open (upstream's parameter server fails its broadcast there)"
                )
                self.refused_broadcasts.append(text)
                warn(self.name, text)

    def report_exit(
        self,
        job_id: str,
        exit_code: int,
        leaks: list[str],
        status: dict[str, str | None] | None = None,
    ) -> None:
        """`status`: the job status a worker of the later releases reports (job_status.py),
        where the executor's stderr went instead of the worker's output."""
        with self._cond:
            record = self._record(job_id)
            record.exit_code = exit_code
            record.leaks = list(leaks)
            record.status = status
            # A worker that is gone no longer holds up the round, nor counts in projections.
            self.scheduler.remove_worker(record.peer_id)
            if self.actions is not None:
                self.actions.remove_worker(record.peer_id)
                self._reached(record.peer_id)
            self.data.slices.forget(record.peer_id)
            self.aggregation.maybe_start()
            self._print_rounds()
            self._cond.notify_all()
        if exit_code != 0:
            failure = last_line(status.get("err") if status else None)
            warn(
                self.name,
                f"{record.name}'s executor exited with {exit_code}"
                + (f": {failure}" if failure else ""),
            )

    # Summary.

    def summary(self) -> dict[str, Any]:
        """Everything recorded, per worker and round; `report.py` derives the verdict from it."""
        from dataclasses import asdict

        with self._cond:
            return {
                "options": asdict(self.options),
                "target_samples": self.options.target_samples,
                "dataset": self.catalog.dataset_name,
                "model": self.catalog.model_repository,
                "scheduler_peer": self.scheduler_peer,
                "parameter_server_peer": self.parameter_server_peer,
                "started_at": self.started_at,
                "wall_s": round(time.time() - self.started_at, 3),
                "digest_mismatches": list(self.digest_mismatches),
                "refused_broadcasts": list(self.refused_broadcasts),
                "cancelled": self.cancelled,
                "aggregations": [dict(a) for a in self.aggregation.rounds],
                "slice_passes": self.data.slices.passes,
                "workers": {r.name: r.summary() for r in self.workers.values()},
            }


@contextmanager
def _as_backend_error() -> Iterator[None]:
    """The coordinator's refusals as the bridge sees them over TCP (client.py)."""
    try:
        yield
    except CoordinatorRefusal as exc:
        kind = exc.kind if exc.kind in ERROR_KINDS else "connector_error"
        raise BackendError(kind, exc.detail) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError("connector_error", f"malformed request: {exc}") from None


def _unreadable(path: Path, exc: OSError) -> BackendError:
    return BackendError("connector_error", f"cannot read {path.name}: {exc.strerror}")


class InProcessBackend:
    """One job's bridge backend when the worker runs in the coordinator's process: the
    calls the TCP API makes, without the HTTP hop.

    A Hypha scheduler runs on another machine. Its stand-in runs on the executor's cores,
    and over TCP it cost them about three times what the bridge itself costs per `status`
    (an HTTP client in the bridge, an HTTP server here, two more thread wake-ups).
    """

    def __init__(self, coordinator: CoordinatorCore, job_id: str) -> None:
        self._coordinator = coordinator
        self._job_id = job_id

    def fetch(self, reference: dict[str, Any]) -> list[RemoteFile]:
        with _as_backend_error():
            files = self._coordinator.fetch(self._job_id, reference)
        return [RemoteFile(name=item["name"], blob=item["blob"]) for item in files]

    def download(self, blob: str, out: BinaryIO) -> None:
        with _as_backend_error():
            path = self._coordinator.blob_path(blob)
        try:
            source = path.open("rb")
        except OSError as exc:
            raise _unreadable(path, exc) from None
        with source:
            while True:
                try:
                    chunk = source.read(1 << 20)
                except OSError as exc:
                    raise _unreadable(path, exc) from None
                if not chunk:
                    return
                out.write(chunk)  # a local write failure is the bridge's io_error

    def send(self, peer: str, data: bytes) -> None:
        with _as_backend_error():
            self._coordinator.push(self._job_id, peer, data)

    def status(self, progress: Any) -> dict[str, Any]:
        with _as_backend_error():
            return self._coordinator.status(self._job_id, progress)

    def next_push(self, after: int, wait_s: float) -> Push | None:
        with _as_backend_error():
            return self._coordinator.next_push(self._job_id, after, wait_s)

    def settle_push(self, seq: int, taken: bool) -> None:
        with _as_backend_error():
            self._coordinator.settle_push(self._job_id, seq, taken)

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        with _as_backend_error():
            return self._coordinator.action(self._job_id, request)
