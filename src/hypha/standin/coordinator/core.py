"""The Hypha side of a local cluster, in one process for N workers: what the coordinator does
whichever generation it plays.

It assigns jobs and ties the parts together under one lock: the model store and data service
(data_service/service.py), the parameter server (parameter_server/), and the records of the
run (records.py). What a generation adds (its scheduler, its job spec, how its rounds close)
is a subclass of its own, alpha17/coordinator.py or actions/coordinator.py, reached through
the hooks below; generations.py names which is built. Workers' bridges reach it over TCP
(server.py serves its HTTP face, http_api.py, which client.py calls), or by direct calls when
they run in this process (in_process.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from hypha.standin.backend import Push
from hypha.standin.console import say, warn
from hypha.standin.coordinator.in_process import InProcessBackend
from hypha.standin.coordinator.records import WorkerRecord
from hypha.standin.data_service.service import Catalog, DataService
from hypha.standin.errors import CoordinatorRefusal
from hypha.standin.job_status import last_line
from hypha.standin.jobs import RunOptions, new_peer_id
from hypha.standin.parameter_server.aggregation import Aggregation
from hypha.standin.parameter_server.server import NesterovOuterOptimizer


class CoordinatorCore(ABC):
    """One run's coordinator. A subclass plays a generation: it sets the class facts below
    and answers the hooks (each called under the lock)."""

    # How the generation names itself in a refusal ("this run plays ...").
    PLAYS: ClassVar[str]
    # Whether its data service hands out Snappy blocks named by their BLAKE3 hash.
    COMPRESSED_SLICES: ClassVar[bool]
    # Whether its parameter server weighs each update by the weight its sender was told.
    WEIGHTED_MEAN: ClassVar[bool]

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
        `push_destination` (repository, token) is the job's `model_destination`, where a
        generation whose scheduler has the final model pushed sends it."""
        self.catalog = catalog
        self.options = options
        self.name = name
        self.clock = clock
        self.push_destination = push_destination
        self.scheduler_peer = new_peer_id()
        self.parameter_server_peer = new_peer_id()
        self.started_at = time.time()
        self.cancelled: str | None = None
        self.workers: dict[str, WorkerRecord] = {}  # by job id
        self.data = DataService(catalog, self.scheduler_peer, compressed=self.COMPRESSED_SLICES)
        self._cond = threading.Condition()
        self.aggregation = Aggregation(
            NesterovOuterOptimizer(
                options.outer_learning_rate, options.outer_momentum, weighted=self.WEIGHTED_MEAN
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
        # What the run found wrong on the protocol's side; report.py fails the run on either.
        self.digest_mismatches: list[str] = []
        self.refused_broadcasts: list[str] = []

    # The generation's part.

    @staticmethod
    @abstractmethod
    def build_job(
        job_id: str,
        options: RunOptions,
        catalog: Catalog,
        scheduler_peer: str,
        parameter_server: str,
    ) -> dict[str, Any]:
        """The job JSON one worker gets, as the generation's scheduler sends it; static, so
        that a job spec can be built without a run (generations.job_spec)."""

    def job_spec(self, job_id: str) -> dict[str, Any]:
        """The job JSON one worker gets."""
        return self.build_job(
            job_id, self.options, self.catalog, self.scheduler_peer, self.parameter_server_peer
        )

    @abstractmethod
    def _round(self) -> int:
        """The round the scheduler is in: how many rounds it has aggregated."""

    @abstractmethod
    def _joined(self, record: WorkerRecord) -> None:
        """A worker's job was assigned: its scheduler adds it."""

    @abstractmethod
    def _left(self, record: WorkerRecord) -> None:
        """A worker's executor exited: it no longer holds up a round or counts in projections."""

    @abstractmethod
    def _waited_for(self, running: list[str]) -> list[str]:
        """Of the running jobs, those the round waits for and sends its update to."""

    @abstractmethod
    def _reported_sent(self, jobs: list[str]) -> list[str]:
        """Those of `jobs` whose update the scheduler counts as sent."""

    @abstractmethod
    def _aggregated(self) -> None:
        """The round's update is out: the scheduler starts the next round."""

    def _push_to_peer(self, record: WorkerRecord, peer: str, data: bytes) -> None:
        """A push to a peer other than the parameter server: none is reachable unless the
        generation says so."""
        raise CoordinatorRefusal(502, "network_error", f"peer {peer} is not reachable")

    @abstractmethod
    def _took_push(self, record: WorkerRecord, push: Push) -> None:
        """The job's bridge has taken `push` off the parameter server's queue."""

    def status(self, job_id: str, progress: Any) -> dict[str, Any]:
        """alpha.17's progress message; refused by a generation that has none."""
        with self._cond:
            self._record(job_id)
        raise CoordinatorRefusal(404, "connector_error", f"this run plays {self.PLAYS}")

    def action(self, job_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """The action protocol's request; refused by a generation that has none."""
        with self._cond:
            self._record(job_id)
        raise CoordinatorRefusal(404, "connector_error", f"this run plays {self.PLAYS}")

    # The run.

    def cancel(self, reason: str) -> None:
        """Cancels every job: the workers see it and stop their executors (SIGTERM)."""
        with self._cond:
            if self.cancelled is None:
                self.cancelled = reason
                warn(self.name, f"cancelling all jobs: {reason}")
            self._cond.notify_all()

    def wait_for_round(self, index: int, timeout_s: float | None = None) -> bool:
        """Waits until round `index` has begun (its previous one broadcast); False if the
        run was cancelled or ended first."""
        with self._cond:
            self._cond.wait_for(
                lambda: self.cancelled is not None or self.finished() or self._round() >= index,
                timeout_s,
            )
            return self._round() >= index

    def wait_finished(self, timeout_s: float | None = None) -> bool:
        """Waits until every worker's job has been assigned and has ended."""
        with self._cond:
            return self._cond.wait_for(self.finished, timeout_s)

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
            self.workers[record.job_id] = record
            self._joined(record)
        say(
            self.name,
            f"job {record.job_id} -> {worker_name} ({len(self.workers)}/{self.options.all_workers})",
        )
        return self.job_spec(record.job_id)

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

    # What workers report.

    def _violation(self, record: WorkerRecord, what: str) -> None:
        record.violations.append(what)
        warn(self.name, f"{record.name} broke the protocol: {what}")

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
                self._push_to_peer(record, peer, data)
                return
            if not self.aggregation.submit(job_id, data):
                self._violation(record, f"a second pseudo-gradient in round {record.round.index}")

    def _senders(self) -> list[str] | None:
        """The jobs a round waits for, once every worker has joined."""
        if len(self.workers) < self.options.workers:
            return None
        running = [job for job, worker in self.workers.items() if worker.exit_code is None]
        return self._waited_for(running)

    def _round_closed(self, aggregation: dict[str, Any]) -> None:
        """Under the lock: the update is out, so the scheduler starts the next round."""
        aggregation["workers"] = sorted(self.workers[job].name for job in aggregation["jobs"])
        now = time.time()
        for worker in self.workers.values():
            if worker.exit_code is None:
                worker.round.aggregated_at = now
        self._aggregated()
        if aggregation["skipped_tensors"]:
            skipped = ", ".join(aggregation["skipped_tensors"])
            warn(self.name, f"round {aggregation['round']}: left out {skipped}")

    def next_push(self, job_id: str, after: int, wait_s: float) -> Push | None:
        """The job's bridge takes its next push."""
        with self._cond:
            record = self._record(job_id)
            push = self.aggregation.next_push(job_id, after, wait_s)
            if push is not None:
                self._took_push(record, push)
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
            self._left(record)
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
