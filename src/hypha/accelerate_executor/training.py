"""The executor: one Hypha DiLoCo training job, top to bottom.

    python -m hypha.accelerate_executor.training --socket S --work-dir W --job J

J is the job JSON, or @path to a file holding it. Run it plainly for one process, or
under `accelerate launch` for several; only rank 0 talks to the bridge. Exit codes:
0 the scheduler said Done, 1 the job failed, 2 the job spec or arguments are bad,
143 cancelled by SIGTERM.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.cli import OneLineArgumentParser
from hypha.accelerate_executor.errors import (
    EXIT_FAILED,
    EXIT_OK,
    Cancelled,
    HyphaError,
    JobSpecError,
    UsageError,
)
from hypha.accelerate_executor.job import Job, parse_job
from hypha.accelerate_executor.supervisor import signal_exit_status

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from hypha.accelerate_executor.bridge import BridgeClient
    from hypha.accelerate_executor.data import Batch, SliceStream
    from hypha.accelerate_executor.distributed import Ranks
    from hypha.accelerate_executor.inputs import ModelInputs
    from hypha.accelerate_executor.progress import StatusAnswer, StatusReporter
    from hypha.accelerate_executor.steps import MicroBatchedStep
    from hypha.accelerate_executor.sync import Synchroniser

PROG = "hypha-executor"
PSEUDO_GRADIENT_DTYPES = ("float32", "bfloat16")
TRUTHY = ("1", "true", "yes")


def say(message: str) -> None:
    """A line for the worker's log: stdout, flushed at once, since lines still buffered
    when the process ends may be lost."""
    print(message, flush=True)


class Verdict(Enum):
    TRAIN = "train"  # no ScheduleUpdate yet this round: train on
    SYNCHRONISE = "synchronise"  # train up to `last_batch`, then synchronise
    DONE = "done"  # the scheduler ended the job


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    last_batch: int | None = None  # SYNCHRONISE: the job-wide batch number to stop after


TRAIN_ON = Decision(Verdict.TRAIN)
JOB_DONE = Decision(Verdict.DONE)


@dataclass
class RoundStats:
    batches: int = 0
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: float = math.nan
    overshoot: int = 0  # batches trained past what ScheduleUpdate asked for (a late answer)


class Trainer:
    job: Job
    accelerator: Accelerator
    ranks: Ranks
    bridge: BridgeClient | None  # rank 0 only
    parameter_count: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_schedule: Any
    inputs: ModelInputs
    data: SliceStream
    batches: Any  # iterator over this rank's shares of the worker's batches
    step: MicroBatchedStep
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
    ) -> None:
        # Heavy imports here, once the job spec is known to be good.
        import torch
        from accelerate import Accelerator

        from hypha.accelerate_executor.bridge import BridgeClient
        from hypha.accelerate_executor.data import SliceStream
        from hypha.accelerate_executor.distributed import (
            ModelWeights,
            Ranks,
            canonical_names,
            process_group_settings,
        )
        from hypha.accelerate_executor.inputs import ModelInputs, slice_names
        from hypha.accelerate_executor.modeling import load_model, load_preprocessor
        from hypha.accelerate_executor.optimization import adamw_arguments, build_lr_schedule
        from hypha.accelerate_executor.progress import StatusReporter
        from hypha.accelerate_executor.steps import MicroBatchedStep
        from hypha.accelerate_executor.sync import Synchroniser

        self.job = job
        config = job.config
        self.accelerator = Accelerator(kwargs_handlers=[process_group_settings()])
        self.ranks = Ranks(self.accelerator)
        self.bridge = BridgeClient(socket_path, work_dir) if self.ranks.is_main else None

        # Model (and preprocessor) files into artifacts/, then into memory on every rank.
        artifacts = work_dir / "artifacts"
        if self.bridge is not None:
            self.bridge.fetch(config.model.artifact)
            if config.preprocessor is not None:
                self.bridge.fetch(config.preprocessor.artifact)
        self.ranks.barrier()
        model = load_model(config.model.task, artifacts, trust_remote_code)
        names = canonical_names(model)
        # Under ZeRO-3's init the parameters are already partitioned: numel() would be 0.
        self.parameter_count = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), **adamw_arguments(job))
        self.lr_schedule = build_lr_schedule(optimizer, config.scheduler)

        processor = None
        if config.preprocessor is not None:
            processor = load_preprocessor(config.preprocessor.task, artifacts, trust_remote_code)
        self.inputs = ModelInputs.for_job(
            job, processor, artifacts, self.accelerator.device, self.ranks.index
        )
        self.data = SliceStream(
            self.bridge, work_dir, config.data, slice_names(config), config.batch_size, self.ranks
        )
        self.batches = iter(self.data)
        deepspeed = self.accelerator.state.deepspeed_plugin
        if deepspeed is not None:
            # accelerate takes DeepSpeed's micro batch from a dataloader, and there is none.
            share = micro_batch_size or self.data.share.size
            deepspeed.deepspeed_config["train_micro_batch_size_per_gpu"] = share
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.model.train()
        self.step = MicroBatchedStep(
            self.accelerator,
            self.model,
            self.optimizer,
            self.ranks,
            config.batch_size,
            config.model.input_names,
            micro_batch_size,
            self.say,
        )

        # The one receive stream opens here, before anything is sent, and stays open.
        self.synchroniser = Synchroniser(
            ModelWeights(self.accelerator, self.model, names),
            self.bridge,
            config.updates,
            config.results,
            getattr(torch, pseudo_gradient_dtype),
        )
        self.reporter = StatusReporter(self.bridge) if self.bridge else None
        self.batches_trained = 0
        self.carried = None

    def run(self) -> None:
        config = self.job.config
        self.say(
            f"job {self.job.job_id}: {config.model.task}, {self.parameter_count / 1e6:.2f}M parameters, "
            f"batch {config.batch_size} over {self.ranks.count} process(es) on {self.accelerator.device}, "
            f"distributed type {self.accelerator.distributed_type.value}, "
            f"mixed precision {self.accelerator.mixed_precision}"
        )
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and (
            self.accelerator.distributed_type.value != "FSDP"
        ):
            # accelerate applies FSDP only on GPUs and says nothing when it does not.
            self.say("warning: the accelerate config asks for FSDP, which needs GPUs: not sharded")
        try:
            for round_number in range(1, sys.maxsize):
                stats = self.inner_steps()
                if stats is None or self.ranks.share(self.report_round(round_number, stats)):
                    self.say(f"round {round_number}: the scheduler ended the job")
                    break
                if self.synchronise(round_number, stats) is Verdict.DONE:
                    self.say(f"round {round_number}: done")
                    break
            self.ranks.finish()
        finally:
            self.data.close()
            if self.reporter is not None:
                self.reporter.close()

    def inner_steps(self) -> RoundStats | None:
        """Trains until the batch ScheduleUpdate names; None if the scheduler said Done.

        The next batch is made ready before the answers are looked at (without waiting),
        which gives the last status's answer that long to arrive; a batch taken for a step
        that does not happen is the next round's first."""
        import torch

        config = self.job.config
        stats = RoundStats()
        decision = TRAIN_ON
        loss_sum = torch.zeros((), device=self.accelerator.device)
        started = time.perf_counter()
        while True:
            batch = self.carried if self.carried is not None else self.next_batch()
            self.carried = None
            decision = self.ranks.share(
                scheduler_decision(self.reporter.answers(), decision) if self.reporter else decision
            )
            if decision.verdict is Verdict.DONE:
                return None
            if decision.last_batch is not None and self.batches_trained >= decision.last_batch:
                self.carried = batch
                break
            loss_sum += self.step(batch)
            self.lr_schedule.step()
            self.batches_trained += 1
            if self.reporter is not None:
                self.reporter.batch_done(self.batches_trained, config.batch_size)
            stats.batches += 1
            if "input_ids" in batch:
                stats.tokens += batch["input_ids"].shape[-1] * config.batch_size
        stats.seconds = time.perf_counter() - started
        stats.samples = stats.batches * config.batch_size
        stats.overshoot = self.batches_trained - (decision.last_batch or 0)
        if self.ranks.count > 1:  # once a round: each rank holds its share of every mean
            loss_sum = self.accelerator.reduce(loss_sum, reduction="sum")
        stats.loss = float(loss_sum.item()) / max(stats.batches, 1)
        return stats

    def next_batch(self) -> Batch:
        return self.inputs(next(self.batches))  # on the device, labels made there

    def report_round(self, round_number: int, stats: RoundStats) -> bool:
        """Rank 0: waits for every status answer (none may be pending at `update`), then
        sends the round's metrics. True if the scheduler ended the job meanwhile."""
        from hypha.accelerate_executor.progress import expect

        if self.reporter is None or self.bridge is None:
            return False
        if scheduler_decision(self.reporter.flush(), TRAIN_ON) == JOB_DONE:
            return True
        metrics = {
            "samples_per_second": stats.samples / stats.seconds,
            "learning_rate": float(self.lr_schedule.get_last_lr()[0]),
            "batches": float(stats.batches),
            "overshoot_batches": float(stats.overshoot),
        }
        if stats.tokens:
            metrics["tokens_per_second"] = stats.tokens / stats.seconds
        if math.isfinite(stats.loss):
            metrics["loss"] = stats.loss
        else:
            self.say(f"warning: the round's loss is {stats.loss}; it is left out of the metrics")
        answer = self.bridge.status({"metrics": {"round": round_number, "metrics": metrics}})
        expect(answer, "Ok", sent="metrics")
        return False

    def synchronise(self, round_number: int, stats: RoundStats) -> Verdict:
        """The DiLoCo outer step; returns the scheduler's verdict on every rank."""
        outcome = self.synchroniser.run(round_number)
        if outcome.answer is not None:
            self.say(
                f"round {round_number}: loss {stats.loss:.4f} | {stats.batches} batches, "
                f"{stats.overshoot} past ScheduleUpdate | {stats.samples / stats.seconds:.1f} "
                f"samples/s | sync {outcome.overhead_s:.3f} s "
                f"({outcome.bytes_out / 1e6:.1f} MB out) + {outcome.seconds['wait']:.2f} s "
                "waiting for the update"
            )
        verdict = None if outcome.answer is None else _SYNC_VERDICTS[outcome.answer]
        return self.ranks.share(verdict) or Verdict.TRAIN

    def say(self, message: str) -> None:
        if self.ranks.is_main:
            say(message)


_SYNC_VERDICTS = {"Continue": Verdict.TRAIN, "Done": Verdict.DONE}


def scheduler_decision(answers: list[StatusAnswer], current: Decision) -> Decision:
    """The round's decision once the status answers that came in are taken into account.

    ScheduleUpdate{counter} means: train `counter` more batches after those the scheduler
    has counted, then synchronise. It counted the batch the answer is for and, where statuses
    overtook each other on the way, the later ones answered before it. Batches trained while
    the answer travelled count among the `counter`.
    """
    from hypha.accelerate_executor.progress import expect

    for status in answers:
        kind = expect(status.answer, "Continue", "ScheduleUpdate", "Done", sent="status")
        if kind == "Done":
            return JOB_DONE
        if kind == "ScheduleUpdate" and current.verdict is Verdict.TRAIN:
            counter = max(0, int(status.answer.get("counter", 0)))
            current = Decision(Verdict.SYNCHRONISE, status.seen + counter)
    return current


def micro_batch_size(value: str) -> int | None:
    """`--micro-batch-size` / HYPHA_MICRO_BATCH_SIZE: samples per micro-batch, or `auto`
    (also empty) for the whole share, halved on an out-of-memory error."""
    if value in ("", "auto"):
        return None
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(
            f"micro-batch size {value!r} is neither a positive number of samples nor auto"
        )
    return int(value)


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(
        prog=PROG, description="Run one Hypha DiLoCo training job over the Job Bridge."
    )
    parser.add_argument("--socket", required=True, type=Path, help="the Job Bridge's Unix socket")
    parser.add_argument("--work-dir", required=True, type=Path, help="the job's work dir")
    parser.add_argument(
        "--job",
        default=os.environ.get("JOB_JSON"),
        help="the job JSON, or @path to a file holding it; default: $JOB_JSON, which the "
        "Hypha worker sets, and which keeps a token out of the process list",
    )
    parser.add_argument(
        "--pseudo-gradient-dtype",
        choices=PSEUDO_GRADIENT_DTYPES,
        default=os.environ.get("HYPHA_PSEUDO_GRADIENT_DTYPE", "float32"),
        help="dtype of the pseudo-gradients sent (bfloat16 halves the bytes; default float32, "
        "which upstream's parameter server expects)",
    )
    parser.add_argument(
        "--micro-batch-size",
        type=micro_batch_size,
        default=os.environ.get("HYPHA_MICRO_BATCH_SIZE", "auto"),
        help="samples per micro-batch (default auto: the whole batch, halved on out of memory)",
    )
    arguments = parser.parse_args(argv)
    # Remote code in a model repository runs only when the operator opts in.
    arguments.trust_remote_code = os.environ.get("HYPHA_TRUST_REMOTE_CODE", "") in TRUTHY
    if arguments.job is None:
        raise UsageError("the job is missing: give --job, or set JOB_JSON")
    return arguments


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Cancelled()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    # DeepSpeed calls collectives that torch has deprecated, and the warning repeats every step.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    try:
        arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
        job = parse_job(arguments.job)
        if not arguments.work_dir.is_dir():
            raise JobSpecError(f"work dir {arguments.work_dir} does not exist")
        Trainer(
            job,
            arguments.socket,
            arguments.work_dir,
            arguments.pseudo_gradient_dtype,
            arguments.micro_batch_size,
            arguments.trust_remote_code,
        ).run()
    except Cancelled as exc:
        say("cancelled (SIGTERM)")
        return exc.exit_code
    except KeyboardInterrupt:
        say("interrupted")
        return signal_exit_status(signal.SIGINT)
    except HyphaError as exc:
        bad_job = "bad job: " if isinstance(exc, JobSpecError) else ""
        print(f"{PROG}: {bad_job}{exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug, or torch/transformers refusing the model: one line, still
        if os.environ.get("HYPHA_DEBUG"):
            traceback.print_exc()
        summary = " ".join(str(exc).split())[:500]
        print(f"{PROG}: failed: {type(exc).__name__}: {summary}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
