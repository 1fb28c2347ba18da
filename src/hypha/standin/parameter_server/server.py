"""The parameter server's math: the true mean of the workers' pseudo-gradients (alpha.17), or
their sum (the action protocol: the scheduler weights each by its share of the round's
samples), then Nesterov.

Upstream averages pairwise, which is the mean only for two workers; this computes the
true mean over any number. Math runs in fp32 and the update keeps the pseudo-gradients'
dtype, so bf16 workers get a bf16 update.

Like Hypha's, it adds only tensors of one name, shape and dtype (upstream's
`apply_tensor_op`): a tensor that one worker sends in bfloat16 and another in float32 is left
out of the update, and the workers' models do not move there.

Non-floating tensors are treated as Hypha's parameter server (candle) treats them: those it
can load keep their dtype and see the scalars (1/n, momentum, learning rate) truncated to
integers, so with a learning rate below 1 their update is zeros; those it cannot load are
left out of the update (and a worker keeps their value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from safetensors.torch import load, save

# What candle cannot load from a safetensors file.
UNLOADABLE = frozenset(
    getattr(torch, name)
    for name in (
        "bool",
        "int8",
        "int16",
        "uint64",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e8m0fnu",
    )
    if hasattr(torch, name)
)


@dataclass
class NesterovOuterOptimizer:
    """m = mu * m + g; u = lr * (mu * m + g); the first round starts from m = g."""

    learning_rate: float = 0.7
    momentum: float = 0.9
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    # True: the pseudo-gradients come weighted (the action protocol's send-update{weight})
    # and are summed; False: alpha.17's, averaged.
    weighted: bool = False

    def step(
        self, pseudo_gradients: list[dict[str, torch.Tensor]]
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The update for one round, and the names it had to leave out (with why)."""
        mean, skipped = true_mean(pseudo_gradients)
        if self.weighted:
            count = len(pseudo_gradients)
            mean = {
                name: tensor * count if tensor.is_floating_point() else tensor
                for name, tensor in mean.items()
            }
        update = {}
        for name, gradient in mean.items():
            dtype = pseudo_gradients[0][name].dtype
            if not dtype.is_floating_point:
                update[name] = self._integer_step(name, gradient)
                continue
            buffer = self.buffers.get(name)
            if buffer is None or buffer.shape != gradient.shape:
                buffer = gradient.clone()
            else:
                buffer.mul_(self.momentum).add_(gradient)
            self.buffers[name] = buffer
            update[name] = (self.learning_rate * (self.momentum * buffer + gradient)).to(dtype)
        return update, skipped

    def _integer_step(self, name: str, mean: torch.Tensor) -> torch.Tensor:
        """candle's arithmetic on an integer tensor: every scalar truncated to an integer."""
        momentum, rate = math.trunc(self.momentum), math.trunc(self.learning_rate)
        buffer = self.buffers.get(name)
        buffer = mean.clone() if buffer is None else buffer * momentum + mean
        self.buffers[name] = buffer
        return (momentum * buffer + mean) * rate

    def step_files(self, files: list[bytes]) -> tuple[bytes, list[str]]:
        """`step` on safetensors files, the update returned as a safetensors file."""
        update, skipped = self.step([load(data) for data in files])
        return save(update), skipped


def true_mean(
    pseudo_gradients: list[dict[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The fp32 mean of every tensor present in all files (an integer one's in its dtype, as
    candle computes it), and the names left out."""
    if not pseudo_gradients:
        return {}, []
    first = pseudo_gradients[0]
    mean: dict[str, torch.Tensor] = {}
    skipped = []
    for name, tensor in first.items():
        tensors = [gradients.get(name) for gradients in pseudo_gradients]
        if any(other is None for other in tensors):
            skipped.append(f"{name} (not in every file)")
            continue
        if any(other is not None and other.shape != tensor.shape for other in tensors):
            skipped.append(f"{name} (shapes differ)")
            continue
        if any(other is not None and other.dtype != tensor.dtype for other in tensors):
            skipped.append(f"{name} (dtypes differ)")
            continue
        if tensor.dtype in UNLOADABLE:
            skipped.append(
                f"{name} ({str(tensor.dtype).removeprefix('torch.')}: Hypha's "
                "parameter server cannot load it)"
            )
            continue
        if not tensor.dtype.is_floating_point:  # candle's integer arithmetic: 1/n truncated
            stacked = torch.stack(tensors)  # type: ignore[arg-type]
            mean[name] = stacked.sum(0, dtype=tensor.dtype) * math.trunc(1 / len(tensors))
            continue
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for other in tensors:
            assert other is not None
            total += other.to(torch.float32)
        mean[name] = total / len(tensors)
    extra = {name for gradients in pseudo_gradients[1:] for name in gradients} - set(first)
    skipped += [f"{name} (not in every file)" for name in sorted(extra)]
    return mean, skipped
