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
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from hypha.accelerate_executor.errors import ExecutorError, JobSpecError
from hypha.accelerate_executor.job import Job, LrScheduler, parse_job

if TYPE_CHECKING:
    import torch

    from hypha.accelerate_executor.progress import StatusAnswer

PSEUDO_GRADIENT_DTYPES = ("float32", "bfloat16")


class Cancelled(BaseException):
    """SIGTERM from the worker, or from a launcher passing it on."""


def say(message: str) -> None:
    """A line for the worker's log: stdout, flushed at once, since lines still buffered
    when the process ends may be lost."""
    print(message, flush=True)


@dataclass
class RoundStats:
    batches: int = 0
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: float = math.nan


class Trainer:
    def __init__(
        self, job: Job, socket_path: Path, work_dir: Path, pseudo_gradient_dtype: str
    ) -> None:
        # Heavy imports here, once the job spec is known to be good.
        import torch
        from accelerate import Accelerator

        from hypha.accelerate_executor.bridge import BridgeClient
        from hypha.accelerate_executor.data import SliceStream, preprocessing
        from hypha.accelerate_executor.distributed import (
            ModelWeights,
            Ranks,
            canonical_names,
            process_group_settings,
        )
        from hypha.accelerate_executor.modeling import load_model, load_preprocessor
        from hypha.accelerate_executor.progress import StatusReporter
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
        model = load_model(config.model.task, artifacts)
        names = canonical_names(model)
        # Under ZeRO-3's init the parameters are already partitioned: numel() would be 0.
        self.parameter_count = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), **adamw_arguments(job))
        self.lr_schedule = build_lr_schedule(optimizer, config.scheduler)
        deepspeed = self.accelerator.state.deepspeed_plugin
        if deepspeed is not None:
            # accelerate takes DeepSpeed's micro batch from a dataloader, and there is none.
            deepspeed.deepspeed_config["train_micro_batch_size_per_gpu"] = config.batch_size
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.model.train()

        self.prepare_batch = None
        if config.preprocessor is not None:
            processor = load_preprocessor(config.preprocessor.task, artifacts)
            self.prepare_batch = preprocessing(config, processor)
        slice_names = None if config.preprocessor else list(config.model.input_names)
        self.data = SliceStream(
            self.bridge, config.data, slice_names, config.batch_size, self.ranks
        )
        self.batches = iter(self.data)

        # The one receive stream opens here, before anything is sent, and stays open.
        self.synchroniser = Synchroniser(
            ModelWeights(self.accelerator, self.model, names),
            self.bridge,
            config.updates,
            config.results,
            getattr(torch, pseudo_gradient_dtype),
        )
        self.reporter = StatusReporter(self.bridge) if self.bridge else None
        self.batches_trained = 0  # over the whole job, as the reporter counts them

    def run(self) -> None:
        config = self.job.config
        self.say(
            f"job {self.job.job_id}: {config.model.task}, {self.parameter_count / 1e6:.2f}M parameters, "
            f"batch {config.batch_size} x {self.ranks.count} process(es) on {self.accelerator.device}, "
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
                if (
                    stats is None
                    or self.ranks.share(self.report_round(round_number, stats)) == "done"
                ):
                    self.say(f"round {round_number}: the scheduler ended the job")
                    break
                if self.synchronise(round_number, stats) == "Done":
                    self.say(f"round {round_number}: done")
                    break
            self.ranks.finish()
        finally:
            self.data.close()
            if self.reporter is not None:
                self.reporter.close()

    def inner_steps(self) -> RoundStats | None:
        """Trains until the scheduler's ScheduleUpdate counter runs out; None if it said Done."""
        import torch

        stats = RoundStats()
        samples_per_step = self.job.config.batch_size * self.ranks.count
        loss_sum = torch.zeros((), device=self.accelerator.device)
        started = time.perf_counter()
        remaining: int | None = None  # batches still to train once ScheduleUpdate has come
        while remaining != 0:
            batch = next(self.batches)
            if self.prepare_batch is not None:
                batch = self.prepare_batch(batch)
            batch = {
                name: tensor.to(self.accelerator.device, non_blocking=True)
                for name, tensor in batch.items()
            }
            with self.accelerator.autocast():
                loss = self.model(**batch).loss
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.lr_schedule.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach()  # stays on the device: no host sync per step
            stats.batches += 1
            self.batches_trained += 1
            stats.samples += samples_per_step
            if "input_ids" in batch:
                stats.tokens += batch["input_ids"].numel() * self.ranks.count
            if self.reporter is not None:
                self.reporter.batch_done(samples_per_step)
            if remaining is not None:
                remaining -= 1
                continue
            # The answer to this step's status may arrive a step late: fine, it is used then.
            decision = self.ranks.share(
                scheduler_decision(self.reporter.answers(), self.batches_trained)
                if self.reporter
                else None
            )
            if decision == "done":
                return None
            remaining = decision if isinstance(decision, int) else None
        stats.seconds = time.perf_counter() - started
        if self.ranks.count > 1:  # once a round: the mean over every rank's batches
            loss_sum = self.accelerator.reduce(loss_sum, reduction="mean")
        stats.loss = float(loss_sum.item()) / stats.batches
        return stats

    def report_round(self, round_number: int, stats: RoundStats) -> str | None:
        """Rank 0: waits for every status answer (none may be pending at `update`), then
        sends the round's metrics. Returns `done` if the scheduler ended the job meanwhile."""
        from hypha.accelerate_executor.progress import expect

        if self.reporter is None or self.bridge is None:
            return None
        if scheduler_decision(self.reporter.flush(), self.batches_trained) == "done":
            return "done"
        metrics = {
            "samples_per_second": stats.samples / stats.seconds,
            "learning_rate": float(self.lr_schedule.get_last_lr()[0]),
            "batches": float(stats.batches),
        }
        if stats.tokens:
            metrics["tokens_per_second"] = stats.tokens / stats.seconds
        if math.isfinite(stats.loss):
            metrics["loss"] = stats.loss
        else:
            self.say(f"warning: the round's loss is {stats.loss}; it is left out of the metrics")
        answer = self.bridge.status({"metrics": {"round": round_number, "metrics": metrics}})
        expect(answer, "Ok", sent="metrics")
        return None

    def synchronise(self, round_number: int, stats: RoundStats) -> str:
        """The DiLoCo outer step; returns the scheduler's Continue or Done on every rank."""
        outcome = self.synchroniser.run(round_number)
        if outcome.answer is not None:
            self.say(
                f"round {round_number}: loss {stats.loss:.4f} | {stats.batches} batches | "
                f"{stats.samples / stats.seconds:.1f} samples/s | sync {outcome.overhead_s:.3f} s "
                f"({outcome.bytes_out / 1e6:.1f} MB out) + {outcome.seconds['wait']:.2f} s "
                "waiting for the update"
            )
        return str(self.ranks.share(outcome.answer))

    def say(self, message: str) -> None:
        if self.ranks.is_main:
            say(message)


def scheduler_decision(answers: list[StatusAnswer], batches_trained: int) -> int | str | None:
    """From the status answers that came in: `done`, the number of batches still to train
    for a ScheduleUpdate, or None.

    The counter counts from the status it answers, and answers arrive while later steps
    already run: those steps are part of the k batches.
    """
    from hypha.accelerate_executor.progress import expect

    decision: int | str | None = None
    for status in answers:
        kind = expect(status.answer, "Continue", "ScheduleUpdate", "Done", sent="status")
        if kind == "Done":
            return "done"
        if kind == "ScheduleUpdate" and decision is None:
            already_trained = batches_trained - status.batches_reported
            decision = max(0, int(status.answer.get("counter", 0)) - already_trained)
    return decision


def adamw_arguments(job: Job) -> dict[str, Any]:
    """The job's optimizer as AdamW arguments; null fields keep torch's defaults."""
    spec = job.config.optimizer
    arguments: dict[str, Any] = {"lr": float(spec.learning_rate)}
    if spec.betas is not None:
        arguments["betas"] = (float(spec.betas[0]), float(spec.betas[1]))
    if spec.epsilon is not None:
        arguments["eps"] = float(spec.epsilon)
    return arguments


def build_lr_schedule(optimizer: torch.optim.Optimizer, spec: LrScheduler | None) -> Any:
    import torch
    from transformers import (
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
        get_wsd_schedule,
    )

    if spec is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if spec.type == "cosine-with-warmup":
        return get_cosine_schedule_with_warmup(optimizer, spec.warmup_steps, spec.training_steps)
    if spec.type == "linear-with-warmup":
        return get_linear_schedule_with_warmup(optimizer, spec.warmup_steps, spec.training_steps)
    # The wire's wsd names no total length: warm up, then decay right away over
    # decay_steps, and hold the floor (10% of the peak) after that.
    return get_wsd_schedule(
        optimizer, spec.warmup_steps, spec.decay_steps, num_stable_steps=0, min_lr_ratio=0.1
    )


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(
        prog="hypha-executor", description="Run one Hypha DiLoCo training job over the Job Bridge."
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
    arguments = parser.parse_args(argv)
    if arguments.job is None:
        parser.error("the job is missing: give --job, or set JOB_JSON")
    return arguments


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Cancelled()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    # DeepSpeed calls collectives that torch has deprecated, and the warning repeats every step.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    try:
        job = parse_job(arguments.job)
        if not arguments.work_dir.is_dir():
            raise JobSpecError(f"work dir {arguments.work_dir} does not exist")
        Trainer(job, arguments.socket, arguments.work_dir, arguments.pseudo_gradient_dtype).run()
    except Cancelled:
        say("cancelled (SIGTERM)")
        return 143
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except JobSpecError as exc:
        print(f"hypha-executor: bad job: {exc}", file=sys.stderr)
        return exc.exit_code
    except ExecutorError as exc:
        print(f"hypha-executor: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug, or torch/transformers refusing the model: one line, still
        if os.environ.get("HYPHA_DEBUG"):
            traceback.print_exc()
        summary = " ".join(str(exc).split())[:500]
        print(f"hypha-executor: failed: {type(exc).__name__}: {summary}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
