"""One optimizer step over this rank's share of the worker's batch, in micro-batches.

The share is split into micro-batches whose gradients accumulate, so the optimizer sees the
whole batch's gradient whatever fits in memory. Each micro-batch's loss is weighted by its
samples over the worker's batch (times the process count, which DDP, FSDP and DeepSpeed
divide by when they average), so the step's gradient is the mean over the worker's
`batch_size` samples even where the ranks' shares differ by one.

The micro-batch size starts at the whole share, or at `--micro-batch-size`; an out-of-memory
error halves it and runs the step again from scratch (accelerate's find_executable_batch_size
pattern). Under several processes the ranks agree before the one micro-batch whose backward
synchronises gradients, so that no rank is left waiting in a collective for one that failed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType
from accelerate.utils.memory import clear_device_cache, should_reduce_batch_size

from hypha.accelerate_executor.errors import HyphaError, NoLossError, OutOfMemory
from hypha.accelerate_executor.training.compiling import Compiled, is_compile_failure
from hypha.accelerate_executor.training.data import Batch
from hypha.accelerate_executor.training.distributed import Ranks


def loss_of(outputs: Any, input_names: Sequence[str]) -> torch.Tensor:
    """The loss in any form a model returns it: an object with `.loss`, a mapping with `loss`,
    a bare loss tensor, or a tuple whose first element is the loss."""
    if isinstance(outputs, torch.Tensor):
        loss: Any = outputs
    elif isinstance(outputs, Mapping):  # transformers' ModelOutput is one, without a None loss
        loss = outputs.get("loss")
    elif isinstance(outputs, (tuple, list)):
        loss = outputs[0] if outputs else None
    else:
        loss = getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise NoLossError(
            f"the model returned no loss (a {type(outputs).__name__}); it gets the job's "
            f"input-names {', '.join(input_names)}, which must include what it computes a loss "
            "from (labels, usually)"
        )
    return loss.reshape(())


def plain_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper, where the wrapper would add nothing
    but host time: without a gradient scaler and off XLA, its `step` asks importlib twice
    whether an optional package is installed, and its `zero_grad` reads the wrapped
    method's signature, on every call (about 0.1 ms a step, 2% of a 5 ms GPU step).
    DeepSpeed's and other wrappers are kept as they are."""
    if (
        isinstance(optimizer, AcceleratedOptimizer)
        and type(optimizer) is AcceleratedOptimizer  # not DeepSpeed's or another subclass
        and optimizer.scaler is None
        and optimizer.accelerator_state.distributed_type != DistributedType.XLA
    ):
        inner: torch.optim.Optimizer = optimizer.optimizer
        return inner
    return optimizer


def plain_backward(accelerator: Accelerator) -> Callable[[torch.Tensor], None]:
    """`Tensor.backward` itself where accelerate's `backward` would only divide the loss by a
    gradient accumulation of 1 first: a kernel, and its gradient's, every micro-batch, for
    nothing (MicroBatchedStep accumulates on its own). DeepSpeed, Megatron and a gradient
    scaler keep accelerate's."""
    if (
        accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)
        and accelerator.scaler is None
        and accelerator.gradient_accumulation_steps == 1
    ):
        return torch.Tensor.backward
    return accelerator.backward


class MicroBatchedStep:
    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        ranks: Ranks,
        batch_size: int,
        input_names: Sequence[str],
        micro_batch_size: int | None = None,
        say: Callable[[str], None] = print,
        compiled: Compiled | None = None,
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.optimizer = plain_optimizer(optimizer)
        self.backward = plain_backward(accelerator)
        self.ranks = ranks
        self.batch_size = batch_size
        self.input_names = list(input_names)
        self.micro_batch_size = micro_batch_size or batch_size
        self.say = say
        self.compiled = compiled or Compiled()
        # Until a compiled step has run, any failure in it may be the compiler's (it compiles
        # lazily, in the first forward and backward): the step falls back to eager and retries.
        self.compile_proven = False
        self.compile_seconds: float | None = None  # the first compiled step's wall time

    def __call__(self, batch: Batch) -> torch.Tensor:
        """Trains one step on `batch` (this rank's share); returns this rank's part of the
        worker batch's mean loss, detached and on the device. The optimizer has stepped."""
        loss = self.gradients(batch)
        self.apply()
        return loss

    def gradients(self, batch: Batch) -> torch.Tensor:
        """The step's forward and backward on `batch`, without the optimizer step: its
        gradient is left on the parameters for `apply` (or `drop`). Returns what `__call__`
        returns. A step is exactly `gradients` then `apply`."""
        samples = next(iter(batch.values())).shape[0]
        while True:
            started = time.perf_counter()
            try:
                loss = self._attempt(batch)
            except Exception as exc:
                if (
                    not self.compiled.active
                    or isinstance(exc, HyphaError)  # the model's or the job's, compiled or not
                    or (self.compile_proven and not is_compile_failure(exc))
                ):
                    raise
                self.compiled.fall_back(exc, self.say)
                self.drop()
                continue
            if loss is not None:
                if self.compiled.active and not self.compile_proven:
                    self.compile_proven = True
                    self.compile_seconds = time.perf_counter() - started
                    self.say(f"compiled step: the first took {self.compile_seconds:.1f} s")
                return loss
            self.drop()
            clear_device_cache(garbage_collection=True)
            tried = min(self.micro_batch_size, samples)
            if tried == 1:
                raise OutOfMemory("out of memory even in micro-batches of 1 sample")
            self.micro_batch_size = tried // 2
            self.say(
                f"out of memory in micro-batches of {tried} samples: "
                f"running the step again in micro-batches of {self.micro_batch_size}"
            )

    def apply(self) -> None:
        """The optimizer step on the gradient `gradients` left."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def drop(self) -> None:
        """Forgets the gradient `gradients` left (or a part of one), as if it never ran."""
        self.optimizer.zero_grad(set_to_none=True)
        self.accelerator.gradient_state._set_sync_gradients(True)

    def _attempt(self, batch: Batch) -> torch.Tensor | None:
        """The step in micro-batches of the current size; None if memory ran out."""
        samples = next(iter(batch.values())).shape[0]
        starts = range(0, samples, self.micro_batch_size)
        *leading, last = [
            {name: tensor[start : start + self.micro_batch_size] for name, tensor in batch.items()}
            for start in starts
        ]
        losses = []
        fits = True
        try:
            for micro in leading:
                losses.append(self._forward_backward(micro, synchronise=False))
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            if not should_reduce_batch_size(exc) and not isinstance(exc, torch.OutOfMemoryError):
                raise
            fits = False
        # Leaving the except block freed the traceback, and with it the step's tensors. The
        # ranks agree only where some rank has leading micro-batches (the same answer on all:
        # they share the micro-batch size), so a step in one micro-batch waits on no other rank.
        largest_share = -(-self.batch_size // self.ranks.data_count)
        if self.micro_batch_size < largest_share and not self.ranks.all(fits):
            return None
        try:
            losses.append(self._forward_backward(last, synchronise=True))
        except RuntimeError as exc:
            if not should_reduce_batch_size(exc) and not isinstance(exc, torch.OutOfMemoryError):
                raise
            if self.ranks.count > 1:  # the other ranks are in the gradients' collective
                raise OutOfMemory(
                    f"out of memory in the micro-batch of {self.micro_batch_size} samples that "
                    "synchronises the gradients; set a smaller --micro-batch-size"
                ) from None
            fits = False
        if not fits:
            return None
        return losses[0] if len(losses) == 1 else torch.stack(losses).sum()

    def _forward_backward(self, micro: Batch, synchronise: bool) -> torch.Tensor:
        """Adds the micro-batch's gradient; returns its loss, weighted by its share of the
        worker's batch. Gradients are synchronised across processes by the last one only
        (accelerate's sync flag does it for DeepSpeed, no_sync for DDP and FSDP)."""
        weight = next(iter(micro.values())).shape[0] / self.batch_size
        # What accelerate's own accumulate() sets; its optimizer steps only when it is True.
        self.accelerator.gradient_state._set_sync_gradients(synchronise)
        with contextlib.nullcontext() if synchronise else self.accelerator.no_sync(self.model):
            with self.accelerator.autocast():
                loss = loss_of(self.model(**micro), self.input_names)
            # Data parallelism averages the gradients over its ranks: scaled back to a sum.
            scale = weight * self.ranks.data_count  # 1 for a whole batch in one process: no op
            self.backward(loss if scale == 1 else loss * scale)
        return loss.detach() if weight == 1 else loss.detach() * weight
