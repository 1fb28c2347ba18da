"""What a training job needs whichever bridge generation drives it: the accelerator and its
ranks, the model and optimizer (fetched through the bridge, loaded on every rank), the LR
schedule, the data slices as this rank's batches, the micro-batched step and the model's full
weights. The alpha.17 loop (alpha17/loop.py, Trainer) and the action loop (actions/loop.py,
ActionTrainer) are each this plus their own protocol.

Torch-free at import: the executor refuses a bad job before torch is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor import telemetry
from hypha.accelerate_executor.protocol.generation import AnyJob

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from hypha.accelerate_executor.bridge.client import BridgeClient
    from hypha.accelerate_executor.training.data import Batch, SliceStream
    from hypha.accelerate_executor.training.distributed import ModelWeights, Ranks
    from hypha.accelerate_executor.training.inputs import ModelInputs
    from hypha.accelerate_executor.training.round_metrics import MemoryPeaks
    from hypha.accelerate_executor.training.settings import RunSettings
    from hypha.accelerate_executor.training.steps import MicroBatchedStep


def say(message: str, attributes: Mapping[str, float] | None = None) -> None:
    """A line for the worker's log: stdout, flushed at once, since lines still buffered
    when the process ends may be lost; and a log record, with `attributes`, where telemetry
    is on."""
    print(message, flush=True)
    telemetry.log_line(message, attributes=attributes)


class Workbench:
    job: AnyJob
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
    weights: ModelWeights  # the model's full state dict, gathered and loaded on every rank

    def __init__(
        self,
        job: AnyJob,
        make_bridge: Callable[[], BridgeClient],
        run: RunSettings,
    ) -> None:
        """`make_bridge` is called on rank 0 only: the one rank that talks to the bridge."""
        work_dir, micro_batch_size = run.work_dir, run.micro_batch_size
        trust_remote_code, compile = run.trust_remote_code, run.compile  # compiling.py
        # Heavy imports here, once the job spec is known to be good.
        from accelerate import Accelerator

        from hypha.accelerate_executor.training.compiling import compile_model
        from hypha.accelerate_executor.training.data import SliceStream
        from hypha.accelerate_executor.training.distributed import (
            ModelWeights,
            Ranks,
            canonical_names,
            process_group_settings,
        )
        from hypha.accelerate_executor.training.inputs import ModelInputs, slice_names
        from hypha.accelerate_executor.training.modeling import (
            checkpoint_activations,
            checkpointed_blocks,
            load_model,
            load_preprocessor,
        )
        from hypha.accelerate_executor.training.optimization import (
            adamw_arguments,
            build_adamw,
            build_lr_schedule,
        )
        from hypha.accelerate_executor.training.parallelism import (
            check_parallelism,
            sharded_loading,
        )
        from hypha.accelerate_executor.training.steps import MicroBatchedStep

        self.job = job
        config = job.config
        self.accelerator = Accelerator(kwargs_handlers=[process_group_settings()])
        self.ranks = Ranks(self.accelerator)
        self.bridge = make_bridge() if self.ranks.is_main else None

        # Model (and preprocessor) files into artifacts/, then into memory on every rank.
        artifacts = work_dir / "artifacts"
        if self.bridge is not None:
            self.bridge.fetch(config.model.artifact)
            if config.preprocessor is not None:
                self.bridge.fetch(config.preprocessor.artifact)
        self.ranks.barrier()
        check_parallelism(self.accelerator, artifacts)
        split = sharded_loading(self.accelerator)  # None: each rank loads it whole
        model = load_model(config.model.task, artifacts, trust_remote_code, split)
        # accelerate's state has an FSDP plugin only under FSDP.
        by_fsdp = self.accelerator.distributed_type.value == "FSDP" and bool(
            self.accelerator.state.fsdp_plugin.activation_checkpointing
        )
        checkpointing = checkpoint_activations(model, run.gradient_checkpointing, by_fsdp)
        names = canonical_names(model)
        # Under ZeRO-3's init the parameters are already partitioned: numel() would be 0.
        self.parameter_count = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        sharded = split is not None or self.accelerator.distributed_type.value in (
            "FSDP",
            "DEEPSPEED",
        )
        optimizer = build_adamw(
            model.parameters(), adamw_arguments(job), self.accelerator.device, sharded
        )
        self.lr_schedule = build_lr_schedule(optimizer, config.scheduler)

        processor = None
        if config.preprocessor is not None:
            processor = load_preprocessor(config.preprocessor.task, artifacts, trust_remote_code)
        self.inputs = ModelInputs.for_job(
            job, processor, artifacts, self.accelerator.device, self.ranks.data_index
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
        # In place, before accelerate wraps it (DDP, FSDP2), as torchtitan orders the two.
        compiled = compile_model(
            model,
            compile,
            self.accelerator.device,
            "TP" if split is not None else self.accelerator.distributed_type.value,
        )
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.model.train()
        self.say(f"step: {compiled.what}")
        if checkpointing is not None:  # counted once accelerate has wrapped the model
            blocks = checkpointed_blocks(self.model)
            self.say(f"activation checkpointing: {blocks} blocks, by {checkpointing}")
        self.step = MicroBatchedStep(
            self.accelerator,
            self.model,
            self.optimizer,
            self.ranks,
            config.batch_size,
            config.model.input_names,
            micro_batch_size,
            self.say,
            compiled,
        )
        self.weights = ModelWeights(self.accelerator, self.model, names, self.ranks)
        if self.weights.shares is not None:
            held = sum(share.numel for share in self.weights.shares.values())
            total = sum(share.full_numel for share in self.weights.shares.values())
            self.say(
                f"weights sharded: rank 0 holds {held / total:.3f} of the weights "
                f"({held / 1e6:.2f}M of {total / 1e6:.2f}M elements), and theta_global for them"
            )

    def next_batch(self) -> Batch:
        return self.inputs(next(self.batches))  # on the device, labels made there

    def peak_memory(self) -> MemoryPeaks:
        """Every rank's peaks since the job began, on every rank (a collective): its process's
        resident set, and the most memory torch's allocator has held on its GPU, where it has
        one. What an operator sizes a host by, and what `selftest` reports."""
        import torch

        from hypha.accelerate_executor.training.round_metrics import (
            MemoryPeaks,
            host_peak_memory,
        )

        on_gpu = self.accelerator.device.type == "cuda"  # ROCm's GPUs are "cuda" devices too
        device = int(torch.cuda.max_memory_allocated(self.accelerator.device)) if on_gpu else 0
        every = self.ranks.gather([host_peak_memory(), device])
        return MemoryPeaks(
            host=[host for host, _ in every],
            device=[device for _, device in every] if on_gpu else None,
        )

    def announce(self, protocol: str = "") -> None:
        """The job's first line, alike in both generations: what trains, on what, sharded how;
        `protocol` ends it where the generation is not alpha.17."""
        config = self.job.config
        self.say(
            f"job {self.job.job_id}: {config.model.task}, {self.parameter_count / 1e6:.2f}M "
            f"parameters, batch {config.batch_size} over {self.ranks.count} process(es) on "
            f"{self.accelerator.device}, distributed type {self.accelerator.distributed_type.value}"
            f", mixed precision {self.accelerator.mixed_precision}"
            + (f", {protocol}" if protocol else "")
        )
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and (
            self.accelerator.distributed_type.value != "FSDP"
        ):
            # accelerate applies FSDP only on GPUs and says nothing when it does not.
            self.say("warning: the accelerate config asks for FSDP, which needs GPUs: not sharded")

    def say(self, message: str, attributes: Mapping[str, float] | None = None) -> None:
        if self.ranks.is_main:
            say(message, attributes)
