"""DiLoCo's outer state on a worker: the global weights a round starts from.

theta_global lives in host memory in fp32 for the whole job (pinned when a GPU is
present, for fast copies), never re-read from disk. At a sync point the worker sends
theta_local - theta_global; when the parameter server's update u arrives, theta_global
becomes theta_global + u and is loaded into the model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hypha.accelerate_executor.errors import ExecutorError


class UpdateError(ExecutorError):
    """The parameter server's update does not fit the model."""


class GlobalWeights:
    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        pin = torch.cuda.is_available()
        self.tensors = {
            name: tensor.detach().to("cpu", torch.float32, copy=True)
            for name, tensor in weights.items()
        }
        if pin:
            self.tensors = {name: tensor.pin_memory() for name, tensor in self.tensors.items()}
        # The pseudo-gradient's buffers, allocated once: a fresh model-sized allocation every
        # round costs more than the subtraction itself.
        self._delta = {name: torch.empty_like(tensor) for name, tensor in self.tensors.items()}

    def write_pseudo_gradient(
        self, local: dict[str, torch.Tensor], path: Path, dtype: torch.dtype = torch.float32
    ) -> int:
        """Writes theta_local - theta_global for every tensor to `path`; returns its size."""
        delta = {
            name: torch.sub(
                tensor.detach().to("cpu", torch.float32), self.tensors[name], out=self._delta[name]
            ).to(dtype)
            for name, tensor in local.items()
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(delta, path)
        return path.stat().st_size

    def merge_update(self, path: Path) -> int:
        """theta_global += u for every tensor the update holds; returns how many it held."""
        update = load_file(path)
        unknown = sorted(set(update) - set(self.tensors))
        if unknown:
            raise UpdateError(
                f"update {path.name} holds tensors the model lacks: {', '.join(unknown[:3])}"
            )
        for name, delta in update.items():
            if delta.shape != self.tensors[name].shape:
                raise UpdateError(
                    f"update {path.name}: {name} has shape {tuple(delta.shape)}, "
                    f"the model {tuple(self.tensors[name].shape)}"
                )
            self.tensors[name] += delta.float()
        return len(update)
