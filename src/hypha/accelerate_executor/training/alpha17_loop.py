"""The executor: one Hypha DiLoCo training job, top to bottom.

    python -m hypha.accelerate_executor.training --socket S --work-dir W --job J

J is the job JSON, or @path to a file holding it. Run it plainly for one process, or
under `accelerate launch` for several; only rank 0 talks to the bridge. Exit codes:
0 the scheduler said Done (alpha.17) or terminate (actions), 1 the job failed, 2 the job
spec or arguments are bad, 143 cancelled by SIGTERM.

Which bridge generation drives the job (`--bridge-generation`, HYPHA_BRIDGE_GENERATION):
`auto` (the default) reads it off the job, and asks the bridge where the job fits both
(`bridge_generation`); the first line says which it is and why. This module runs alpha.17's
loop (Trainer); action_loop.ActionTrainer the action protocol's.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from hypha.accelerate_executor import telemetry
from hypha.accelerate_executor.bridge.bodies import round_metrics
from hypha.accelerate_executor.bridge.client import Continue, Done, Ok, ScheduleUpdate, expect
from hypha.accelerate_executor.entry import (
    OneLineArgumentParser,
    exit_without_teardown,
    run_main,
)
from hypha.accelerate_executor.errors import (
    EXIT_OK,
    Cancelled,
    JobSpecError,
    UsageError,
)
from hypha.accelerate_executor.spec.job import (
    GENERATIONS,
    ActionJob,
    Ambiguous,
    AnyJob,
    Generation,
    Job,
    job_bytes,
    parse_any_job_bytes,
    why_refused,
)
from hypha.accelerate_executor.training import settings
from hypha.accelerate_executor.training.clocks import Laps
from hypha.accelerate_executor.training.workbench import Workbench, say

if TYPE_CHECKING:
    from hypha.accelerate_executor.bridge.progress import StatusAnswer, StatusReporter
    from hypha.accelerate_executor.training.data import Batch
    from hypha.accelerate_executor.training.sync import Synchroniser

# The module a worker runs (`python -m ...`), and what this process's own lines start with.
PROG = "hypha.accelerate_executor.training"
# Unless set: what each generation's own executors send, since a parameter server adds only
# tensors of the same name, shape and dtype (upstream's `apply_tensor_op`), and a pool mixing
# dtypes aggregates nothing. The action protocol's accelerate executor casts its
# pseudo-gradients to bfloat16 (`extract_gradients` in its utils.py, hypha-space/hypha
# executors/accelerate/.../utils.py, index id 66915679428, commit 012f80dd); alpha.17's sends
# float32 (docs/protocol.md).
PSEUDO_GRADIENT_DTYPE_BY_GENERATION = {"actions": "bfloat16", "alpha17": "float32"}


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


class Trainer(Workbench):
    """The alpha.17 generation's DiLoCo loop (docs/protocol.md): statuses after every batch, the
    round's end from ScheduleUpdate, the update over the job's one receive stream."""

    job: Job
    synchroniser: Synchroniser
    reporter: StatusReporter | None  # rank 0 only
    batches_trained: int  # over the whole job; a status's batch number
    carried: Batch | None  # taken for a step that the round's end came before

    def __init__(
        self,
        job: Job,
        socket_path: Path,
        work_dir: Path,
        pseudo_gradient_dtype: str,
        micro_batch_size: int | None = None,
        trust_remote_code: bool = False,
        compile: str = "off",
    ) -> None:
        import torch

        from hypha.accelerate_executor.bridge.client import BridgeClient
        from hypha.accelerate_executor.bridge.progress import StatusReporter
        from hypha.accelerate_executor.training.sync import Synchroniser

        super().__init__(
            job,
            lambda: BridgeClient(socket_path, work_dir),
            work_dir,
            micro_batch_size,
            trust_remote_code,
            compile,
        )
        config = job.config
        # The one receive stream opens here, before anything is sent, and stays open.
        self.synchroniser = Synchroniser(
            self.weights,
            self.bridge,
            config.updates,
            config.results,
            getattr(torch, pseudo_gradient_dtype),
        )
        self.reporter = StatusReporter(self.bridge) if self.bridge else None
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
            loss_sum = self.accelerator.reduce(loss_sum, reduction="sum")
        stats.loss = float(loss_sum.item()) / max(stats.batches, 1)
        stats.parts = {**laps.parts, "cpu": laps.cpu_seconds}
        return stats

    def report_round(self, round_number: int, stats: RoundStats) -> Done | None:
        """Rank 0: waits for every status answer (none may be pending at `update`), then
        sends the round's metrics. Done if the scheduler ended the job meanwhile."""
        if self.reporter is None or self.bridge is None:
            return None
        flush = Laps()
        if isinstance(done := scheduler_decision(self.reporter.flush(), TRAIN_ON), Done):
            return done
        stats.parts["statuses"] += flush.seconds
        metrics = {
            "samples_per_second": stats.samples / stats.seconds,
            "learning_rate": float(self.lr_schedule.get_last_lr()[0]),
            "batches": float(stats.batches),
            "overshoot_batches": float(stats.overshoot),
        }
        if stats.tokens:
            metrics["tokens_per_second"] = stats.tokens / stats.seconds
        if (peak := self.peak_device_memory()) is not None:
            metrics["peak_device_memory_bytes"] = float(peak)
        if math.isfinite(stats.loss):
            metrics["loss"] = stats.loss
        else:
            self.say(f"warning: the round's loss is {stats.loss}; it is left out of the metrics")
        answer = self.bridge.status(round_metrics(round_number, metrics))
        expect(answer, Ok, sent="metrics")
        return None

    def synchronise(self, round_number: int, stats: RoundStats) -> Continue | Done:
        """The DiLoCo outer step; returns the scheduler's answer on every rank."""
        outcome = self.synchroniser.run(round_number)
        if outcome.answer is not None:
            parts = ", ".join(f"{name} {1e3 * s:.1f} ms" for name, s in stats.parts.items())
            figures = {
                "round": float(round_number),
                "loss": stats.loss,
                "learning_rate": float(self.lr_schedule.get_last_lr()[0]),
                "samples_per_second": stats.samples / stats.seconds,
                **({"tokens_per_second": stats.tokens / stats.seconds} if stats.tokens else {}),
                "batches": float(stats.batches),
                "overshoot_batches": float(stats.overshoot),
                **{f"{name}_seconds": s for name, s in stats.parts.items()},
                "sync_seconds": outcome.overhead_s,
                "sent_bytes": float(outcome.bytes_out),
                "update_wait_seconds": outcome.seconds["wait"],
            }
            telemetry.round_ended(figures)
            self.say(
                f"round {round_number}: loss {stats.loss:.4f} | {stats.batches} batches, "
                f"{stats.overshoot} past ScheduleUpdate | {stats.samples / stats.seconds:.1f} "
                f"samples/s | {parts} | sync {outcome.overhead_s:.3f} s "
                f"({outcome.bytes_out / 1e6:.1f} MB out) + {outcome.seconds['wait']:.2f} s "
                "waiting for the update",
                figures,
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


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    """The arguments, and every setting (settings.SETTINGS) from its flag or `HYPHA_*`
    variable: a value a setting refuses ends here, before the bridge is touched."""
    parser = OneLineArgumentParser(
        prog=f"python -m {PROG}",
        description="Run one Hypha DiLoCo training job over the Job Bridge.",
    )
    parser.add_argument("--socket", required=True, type=Path, help="the Job Bridge's Unix socket")
    parser.add_argument("--work-dir", required=True, type=Path, help="the job's work dir")
    parser.add_argument(
        "--job",
        default=os.environ.get("JOB_JSON"),
        help="the job JSON, or @path to a file holding it; default: $JOB_JSON, which the "
        "Hypha worker sets, and which keeps a token out of the process list",
    )
    settings.add_flags(parser)
    arguments = parser.parse_args(argv)
    if arguments.job is None:
        raise UsageError("the job is missing: give --job, or set JOB_JSON")
    return arguments


def bridge_generation(
    source: str, choice: str, socket_path: Path
) -> tuple[AnyJob, Generation, str]:
    """The job as the chosen generation reads it, that generation, and why it was chosen.
    Only a job both generations accept (an alpha.17 job, which action-era types read too) is
    decided by the bridge: every rank asks it, with a body that reaches no scheduler."""
    data = job_bytes(source)
    if choice in GENERATIONS:
        forced: Generation = "alpha17" if choice == "alpha17" else "actions"
        job = parse_any_job_bytes(data, forced)
        assert not isinstance(job, Ambiguous)
        return job, forced, "as asked"
    parsed = parse_any_job_bytes(data)
    if isinstance(parsed, Job):
        return parsed, "alpha17", why_refused(data, "actions")
    if isinstance(parsed, ActionJob):
        return parsed, "actions", why_refused(data, "alpha17")
    from hypha.accelerate_executor.bridge.action_client import probe_generation

    probed = probe_generation(socket_path)
    if probed == "actions":
        return parsed.as_actions, "actions", "the job fits both; the bridge serves /action/update"
    if probed == "alpha17":
        return parsed.as_alpha17, "alpha17", "the job fits both; the bridge has no /action/update"
    return parsed.as_alpha17, "alpha17", "the job names updates and results; the bridge did not say"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Cancelled()


def _unexpected(exc: Exception) -> str:
    """A bug, or torch/transformers refusing the model: one line, still."""
    if os.environ.get("HYPHA_DEBUG"):
        traceback.print_exc()
    return f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"


def main(argv: list[str] | None = None) -> int:
    from hypha.accelerate_executor.training.action_loop import ActionTrainer

    signal.signal(signal.SIGTERM, _on_sigterm)
    # DeepSpeed calls collectives that torch has deprecated, and the warning repeats every step.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")

    def body() -> int:
        arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
        job, generation, why = bridge_generation(
            arguments.job, arguments.bridge_generation, arguments.socket
        )
        telemetry.start(job.job_id)
        if not arguments.work_dir.is_dir():
            raise JobSpecError(f"work dir {arguments.work_dir} does not exist")
        if os.environ.get("RANK", "0") == "0":
            say(f"{PROG}: bridge generation {generation} ({why})")
        settings = (
            arguments.socket,
            arguments.work_dir,
            arguments.pseudo_gradient_dtype or PSEUDO_GRADIENT_DTYPE_BY_GENERATION[generation],
            arguments.micro_batch_size,
            arguments.trust_remote_code,
        )
        if isinstance(job, ActionJob):
            ActionTrainer(
                job,
                *settings,
                arguments.speculative_step,
                model_dir=arguments.model_dir,
                compile=arguments.compile,
            ).run()
        else:
            Trainer(job, *settings, compile=arguments.compile).run()
        return EXIT_OK

    return run_main(PROG, body, _unexpected)


if __name__ == "__main__":
    exit_without_teardown(main())
