"""A LeNet-sized model, its batches and a micro-batched step over it, for the tests of a step (in this process, and in a subprocess that compiles it)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator

from hypha.accelerate_executor.training.distributed import Ranks
from hypha.accelerate_executor.training.steps import MicroBatchedStep


class LeNetish(torch.nn.Module):
    """A small conv net on 1x28x28 images; `form` picks how forward returns its loss."""

    def __init__(self, form: str = "object", oom_above: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 4, 5)
        self.head = torch.nn.Linear(4 * 12 * 12, 10)
        self.form = form
        self.oom_above = oom_above

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> Any:
        if self.oom_above is not None and len(pixel_values) > self.oom_above:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        hidden = torch.nn.functional.max_pool2d(torch.relu(self.conv(pixel_values)), 2)
        logits = self.head(hidden.flatten(1))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {
            "object": lambda: type("Out", (), {"loss": loss, "logits": logits})(),
            "mapping": lambda: OrderedDict(loss=loss, logits=logits),
            "tensor": lambda: loss,
            "tuple": lambda: (loss, logits),
            "none": lambda: OrderedDict(logits=logits),
        }[self.form]()


def batch(samples: int = 12) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(samples, 1, 28, 28, generator=generator),
        "labels": torch.randint(0, 10, (samples,), generator=generator),
    }


def stepper(
    model: torch.nn.Module,
    optimizer: Callable[[Any], torch.optim.Optimizer],
    micro_batch_size: int | None = None,
    said: list[str] | None = None,
) -> MicroBatchedStep:
    accelerator = Accelerator(cpu=True)
    prepared_model, prepared_optimizer = accelerator.prepare(model, optimizer(model.parameters()))
    return MicroBatchedStep(
        accelerator, prepared_model, prepared_optimizer, Ranks(accelerator), 12,
        ["pixel_values", "labels"], micro_batch_size, (said if said is not None else []).append,
    )  # fmt: skip


def sgd(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=1.0)  # weights move by exactly the gradient


def adamw(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-2)


def gradient_of_one_step(model: LeNetish, micro_batch_size: int | None) -> list[torch.Tensor]:
    before = [p.detach().clone() for p in model.parameters()]
    stepper(model, sgd, micro_batch_size)(batch())
    return [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]
