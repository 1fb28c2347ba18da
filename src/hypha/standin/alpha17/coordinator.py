"""alpha.17's coordinator: the shared core (coordinator/core.py) with alpha.17's batch
scheduler (scheduler.py) answering each progress message, and alpha.17's job spec.

Every running worker's update is waited for, and a push goes to the parameter server only.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from hypha.accelerate_executor.protocol.alpha17.job import (
    ExecutorSpec,
    Job,
    PeersReference,
    TrainConfig,
)
from hypha.accelerate_executor.protocol.alpha17.messages import (
    PROGRESS,
    Continue,
    Error,
    MetricsBody,
    MetricsProgress,
    Ok,
    Progress,
    SchedulerAnswer,
    ScheduleUpdate,
    StatusBody,
    StatusProgress,
    answer_body,
)
from hypha.accelerate_executor.protocol.job import Strategy
from hypha.standin.alpha17.scheduler import BatchScheduler, State
from hypha.standin.backend import Push
from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.coordinator.records import RoundRecord, WorkerRecord
from hypha.standin.data_service.service import Catalog
from hypha.standin.errors import CoordinatorRefusal, ProgressError
from hypha.standin.jobs import DESCRIPTOR, RunOptions, train_config, written


def job_spec(
    job_id: str, options: RunOptions, catalog: Catalog, scheduler_peer: str, parameter_server: str
) -> dict[str, Any]:
    """The job JSON for one worker: alpha.17's config also names where updates go and
    results come from."""
    peers = PeersReference(type="peers", peers=[parameter_server], strategy=Strategy(type="All"))
    shared = train_config(options, catalog, scheduler_peer)
    train = TrainConfig.model_validate({**shared, "updates": peers, "results": peers})
    executor = ExecutorSpec(class_="train", descriptor=DESCRIPTOR, config=train)
    return written(Job(job_id=job_id, executor=executor))


class Alpha17Coordinator(CoordinatorCore):
    PLAYS = "alpha.17"
    COMPRESSED_SLICES = False
    WEIGHTED_MEAN = False
    build_job = staticmethod(job_spec)

    def __init__(self, catalog: Catalog, options: RunOptions, **core: Any) -> None:
        super().__init__(catalog, options, **core)
        self.scheduler = BatchScheduler(options.target_samples, options.rounds, self.clock)

    def _round(self) -> int:
        return self.scheduler.round

    def _joined(self, record: WorkerRecord) -> None:
        self.scheduler.add_worker(record.peer_id, self.options.batch_size)

    def _left(self, record: WorkerRecord) -> None:
        self.scheduler.remove_worker(record.peer_id)

    def _waited_for(self, running: list[str]) -> list[str]:
        return running

    def _reported_sent(self, jobs: list[str]) -> list[str]:
        return jobs  # every worker's update is waited for

    def _aggregated(self) -> None:
        self.scheduler.updated()

    def _took_push(self, record: WorkerRecord, push: Push) -> None:
        pass  # the scheduler hears the end of a round from the parameter server, not a bridge

    def status(self, job_id: str, progress: Any) -> dict[str, Any]:
        """A Progress message (protocol/alpha17/messages.PROGRESS as JSON), answered as
        alpha.17's scheduler does."""
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
