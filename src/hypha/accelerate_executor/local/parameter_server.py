"""The parameter server's math: the true mean of the workers' pseudo-gradients, then Nesterov.

Upstream averages pairwise, which is the mean only for two workers; this computes the
true mean over any number. Math runs in fp32 and the update keeps the pseudo-gradients'
dtype, so bf16 workers get a bf16 update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from safetensors.torch import load, save


@dataclass
class NesterovOuterOptimizer:
    """m = mu * m + g; u = lr * (mu * m + g); the first round starts from m = g."""

    learning_rate: float = 0.7
    momentum: float = 0.9
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    def step(
        self, pseudo_gradients: list[dict[str, torch.Tensor]]
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The update for one round, and the names it had to leave out (with why)."""
        mean, skipped = true_mean(pseudo_gradients)
        update = {}
        for name, gradient in mean.items():
            buffer = self.buffers.get(name)
            if buffer is None or buffer.shape != gradient.shape:
                buffer = gradient.clone()
            else:
                buffer.mul_(self.momentum).add_(gradient)
            self.buffers[name] = buffer
            dtype = pseudo_gradients[0][name].dtype
            update[name] = (self.learning_rate * (self.momentum * buffer + gradient)).to(dtype)
        return update, skipped

    def step_files(self, files: list[bytes]) -> tuple[bytes, list[str]]:
        """`step` on safetensors files, the update returned as a safetensors file."""
        update, skipped = self.step([load(data) for data in files])
        return save(update), skipped


def true_mean(
    pseudo_gradients: list[dict[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The fp32 mean of every tensor present in all files, and the names left out."""
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
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for other in tensors:
            assert other is not None
            total += other.to(torch.float32)
        mean[name] = total / len(tensors)
    extra = {name for gradients in pseudo_gradients[1:] for name in gradients} - set(first)
    skipped += [f"{name} (not in every file)" for name in sorted(extra)]
    return mean, skipped
