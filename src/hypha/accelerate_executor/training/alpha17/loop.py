"""alpha.17's DiLoCo loop (docs/protocol.md), top to bottom: train, one status per batch
(status_reporter.py, without waiting for its answer), until ScheduleUpdate's counter of
batches is trained; the round's metrics; the sync round (synchroniser.py); again until Done.
Its typed round decision is scheduler_decision's."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hypha.accelerate_executor.protocol.alpha17.job import Job
from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    Done,
    Ok,
    ScheduleUpdate,
    expect,
    round_metrics,
)
from hypha.accelerate_executor.training.clocks import Laps
from hypha.accelerate_executor.training.round_metrics import (
    MemoryPeaks,
    memory_text,
    round_ended,
    training_metrics,
)
from hypha.accelerate_executor.training.workbench import Workbench

if TYPE_CHECKING:
    from hypha.accelerate_executor.training.alpha17.status_reporter import (
        StatusAnswer,
        StatusReporter,
    )
    from hypha.accelerate_executor.training.alpha17.synchroniser import Synchroniser
    from hypha.accelerate_executor.training.data import Batch
    from hypha.accelerate_executor.training.settings import RunSettings


@dataclass(frozen=True)
class Decision:
    """Where the round ends: nowhere yet (no ScheduleUpdate), or after `last_batch`, the
    job-wide number of the batch to synchronise after."""

    last_batch: int | None = None


TRAIN_ON = Decision()


@dataclass
class RoundStats:
    batches: int = 0
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: float = math.nan
    overshoot: int = 0  # batches trained past what ScheduleUpdate asked for (a late answer)
    # Where the round's wall time went on this rank (data, step, statuses), and the CPU
    # time the process took meanwhile, all its threads counted.
    parts: dict[str, float] = field(default_factory=dict)
    memory: MemoryPeaks | None = None  # every rank's, gathered as the round's training ends


class Trainer(Workbench):
    """The alpha.17 generation's DiLoCo loop (docs/protocol.md): statuses after every batch, the
    round's end from ScheduleUpdate, the update over the job's one receive stream."""

    job: Job
    synchroniser: Synchroniser
    reporter: StatusReporter | None  # rank 0 only
    batches_trained: int  # over the whole job; a status's batch number
    carried: Batch | None  # taken for a step that the round's end came before

    def __init__(self, job: Job, run: RunSettings) -> None:
        import torch

        from hypha.accelerate_executor.training.alpha17.bridge import Alpha17Bridge
        from hypha.accelerate_executor.training.alpha17.status_reporter import StatusReporter
        from hypha.accelerate_executor.training.alpha17.synchroniser import Synchroniser

        self.client: Alpha17Bridge | None = None

        def make_bridge() -> Alpha17Bridge:
            self.client = Alpha17Bridge(run.socket_path, run.work_dir)
            return self.client

        super().__init__(job, make_bridge, run)
        config = job.config
        # The one receive stream opens here, before anything is sent, and stays open.
        self.synchroniser = Synchroniser(
            self.weights,
            self.ranks,
            run.work_dir,
            self.client,
            config.updates,
            config.results,
            getattr(torch, run.pseudo_gradient_dtype),
        )
        self.reporter = StatusReporter(self.client) if self.client else None
        self.batches_trained = 0
        self.carried = None

    def run(self) -> None:
        self.announce()
        finished = False
        try:
            for round_number in range(1, sys.maxsize):
                stats = self.inner_steps()
                if isinstance(stats, Done) or isinstance(
                    self.ranks.share(self.report_round(round_number, stats)), Done
                ):
                    self.say(f"round {round_number}: the scheduler ended the job")
                    break
                if isinstance(self.synchronise(round_number, stats), Done):
                    self.say(f"round {round_number}: done")
                    break
            finished = True
        finally:
            # The process ends without the interpreter's join of our threads (see
            # exit_without_teardown): a finished job lets the slice fetch in flight end, so the
            # bridge never sees a request cut; a failing or cancelled one does not wait for it.
            self.data.close(wait=finished)
            if self.reporter is not None:
                self.reporter.close()
        self.ranks.finish()

    def inner_steps(self) -> RoundStats | Done:
        """Trains until the batch ScheduleUpdate names, or the scheduler says Done.

        The next batch is made ready before the answers are looked at (without waiting),
        which gives the last status's answer that long to arrive; a batch taken for a step
        that does not happen is the next round's first."""
        import torch

        config = self.job.config
        stats = RoundStats()
        decision = TRAIN_ON
        loss_sum = torch.zeros((), device=self.accelerator.device)
        laps = Laps("step", "data", "statuses")
        while True:
            batch = self.carried if self.carried is not None else self.next_batch()
            self.carried = None
            laps.lap("data")
            # Until ScheduleUpdate has come, a batch starts only once every status before the
            # last one is answered: a ScheduleUpdate{0} finds at most that one batch past it.
            through = self.batches_trained - 1 if decision.last_batch is None else 0
            outcome = self.ranks.share(
                scheduler_decision(self.reporter.answers(through), decision)
                if self.reporter
                else decision
            )
            laps.lap("statuses")
            if isinstance(outcome, Done):
                return outcome
            decision = outcome
            if decision.last_batch is not None and self.batches_trained >= decision.last_batch:
                self.carried = batch
                break
            loss_sum += self.step(batch)
            self.lr_schedule.step()
            self.batches_trained += 1
            laps.lap("step")
            if self.reporter is not None:
                self.reporter.batch_done(self.batches_trained, config.batch_size)
            stats.batches += 1
            if "input_ids" in batch:
                stats.tokens += batch["input_ids"].shape[-1] * config.batch_size
            laps.lap("statuses")
        stats.seconds = laps.seconds
        stats.samples = stats.batches * config.batch_size
        stats.overshoot = self.batches_trained - (decision.last_batch or 0)
        if self.ranks.count > 1:  # once a round: each rank holds its share of every mean
            # (a tensor-parallel group's ranks hold the same share)
            loss_sum = self.accelerator.reduce(loss_sum, reduction="sum") / self.ranks.per_data_rank
        stats.loss = float(loss_sum.item()) / max(stats.batches, 1)
        stats.memory = self.peak_memory()  # a collective too
        stats.parts = {**laps.parts, "cpu": laps.cpu_seconds}
        return stats

    def report_round(self, round_number: int, stats: RoundStats) -> Done | None:
        """Rank 0: waits for every status answer (none may be pending at `update`), then
        sends the round's metrics. Done if the scheduler ended the job meanwhile."""
        if self.reporter is None or self.client is None:
            return None
        flush = Laps()
        if isinstance(done := scheduler_decision(self.reporter.flush(), TRAIN_ON), Done):
            return done
        stats.parts["statuses"] += flush.seconds
        metrics = self.metrics_of(stats)
        if not math.isfinite(stats.loss):
            self.say(f"warning: the round's loss is {stats.loss}; it is left out of the metrics")
        answer = self.client.status(round_metrics(round_number, metrics))
        expect(answer, Ok, sent="metrics")
        return None

    def metrics_of(self, stats: RoundStats) -> dict[str, float]:
        """The round's figures for the scheduler's `metrics` and the round's log line."""
        return {
            **training_metrics(
                batches=stats.batches,
                samples=stats.samples,
                seconds=stats.seconds,
                learning_rate=float(self.lr_schedule.get_last_lr()[0]),
                loss=stats.loss,
                tokens=stats.tokens,
                memory=stats.memory,
            ),
            "overshoot_batches": float(stats.overshoot),
        }

    def synchronise(self, round_number: int, stats: RoundStats) -> Continue | Done:
        """The DiLoCo outer step; returns the scheduler's answer on every rank."""
        outcome = self.synchroniser.run(round_number)
        if outcome.answer is not None:
            parts = ", ".join(f"{name} {1e3 * s:.1f} ms" for name, s in stats.parts.items())
            figures = {
                **self.metrics_of(stats),
                **{f"{name}_seconds": s for name, s in stats.parts.items()},
                "sync_seconds": outcome.overhead_s,
                "sent_bytes": float(outcome.bytes_out),
                "update_wait_seconds": outcome.seconds["wait"],
            }
            round_ended(
                self.say,
                round_number,
                figures,
                f"loss {stats.loss:.4f} | {stats.batches} batches, "
                f"{stats.overshoot} past ScheduleUpdate | {stats.samples / stats.seconds:.1f} "
                f"samples/s | {parts} | sync {outcome.overhead_s:.3f} s "
                f"({outcome.bytes_out / 1e6:.1f} MB out) + {outcome.seconds['wait']:.2f} s "
                "waiting for the update"
                + (f" | {memory_text(stats.memory)}" if stats.memory else ""),
            )
        answer = self.ranks.share(outcome.answer)
        return answer if isinstance(answer, Done) else Continue()


def scheduler_decision(answers: list[StatusAnswer], current: Decision) -> Decision | Done:
    """The round's decision once the status answers that came in are taken into account.

    ScheduleUpdate{counter} means: train `counter` more batches after those the scheduler
    has counted, then synchronise. It counted the batch the answer is for and, where statuses
    overtook each other on the way, the later ones answered before it. Batches trained while
    the answer travelled count among the `counter`.
    """
    for status in answers:
        answer = status.answer
        expect(answer, Continue, ScheduleUpdate, Done, sent="status")
        if isinstance(answer, Done):
            return answer
        if isinstance(answer, ScheduleUpdate) and current.last_batch is None:
            current = Decision(status.seen + answer.counter)
    return current
