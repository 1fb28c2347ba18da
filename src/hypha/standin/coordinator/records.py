"""What the coordinator records per worker and round, for the run summary (report.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RoundRecord:
    index: int
    # What the worker reported: one status per batch, with its samples.
    batches: int = 0
    samples: int = 0
    # Throughput runs from the first report on, so the first batch's samples are not timed.
    first_batch_samples: int = 0
    first_status_at: float | None = None
    # ScheduleUpdate: the batches reported when it was answered, and its counter.
    scheduled_at_batch: int | None = None
    counter: int | None = None
    # The batches the executor says it trained (its round metrics' "batches").
    trained_batches: int | None = None
    update_at: float | None = None
    aggregated_at: float | None = None
    received_at: float | None = None

    @property
    def overshoot(self) -> int | None:
        """Batches reported after ScheduleUpdate beyond its counter (late answers)."""
        if self.scheduled_at_batch is None or self.counter is None:
            return None
        return self.batches - self.scheduled_at_batch - self.counter


@dataclass
class WorkerRecord:
    name: str
    peer_id: str
    job_id: str
    assigned_at: float
    joined_round: int = 0  # the round its job began in (a late joiner's is not 0)
    rounds: list[RoundRecord] = field(default_factory=lambda: [RoundRecord(0)])
    # Keyed by the round number the executor reports.
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    # Action era: how many aggregates the model a late joiner received had been through
    # (the sender's applied ones), and the `global_digest` of each sent update keyed by the
    # aggregates its global model had been through (this base plus the executor's round).
    model_base: int = 0
    # A late joiner's wait for the model is over: its `received-model` came, or an error.
    model_wait_over: bool = False
    digests: dict[int, float] = field(default_factory=dict)
    # Action era: the batches its `batch-completed` statuses reported, and those its
    # `sent-update`s counted; equal when no trained batch was lost or counted twice (but for
    # those trained after its last send, when the job ended first).
    batches_completed: int = 0
    batches_sent: int = 0
    # Those trained once the final aggregate was out: upstream's scheduler answers an
    # `applied-update` before the broadcast is over with `execute-batch`, even the last
    # round's, and no update follows it.
    batches_past_end: int = 0
    # Reported since its last `sent-update`: what that update must count, and, at the end,
    # what it trained that no update carried (past the end, or in a final round aggregated
    # at the quorum without it).
    batches_unsent: int = 0
    slices: list[int] = field(default_factory=list)
    exit_code: int | None = None
    leaks: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    # The job status a worker of the later releases reports (its executor's stderr tail).
    status: dict[str, str | None] | None = None

    @property
    def round(self) -> RoundRecord:
        return self.rounds[-1]

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        for entry, record in zip(data["rounds"], self.rounds, strict=True):
            entry["overshoot"] = record.overshoot
        timed = [r for r in self.rounds if r.first_status_at and r.update_at]
        seconds = sum(
            r.update_at - r.first_status_at for r in timed if r.update_at and r.first_status_at
        )
        samples = sum(r.samples - r.first_batch_samples for r in timed)
        data["samples_per_s"] = round(samples / seconds, 2) if seconds > 0 else None
        data["rounds_completed"] = sum(r.received_at is not None for r in self.rounds)
        data["batches_reported"] = sum(r.batches for r in self.rounds)
        trained = [r.trained_batches for r in self.rounds if r.trained_batches is not None]
        data["batches_trained"] = sum(trained) if trained else None
        data["overshoot"] = sum(r.overshoot or 0 for r in self.rounds)
        repeated = len(self.slices) - len(set(self.slices))
        data["slices_repeated"] = repeated
        return data
