"""What rank 0 decides, every rank learns; and the model's full weights, however sharded.

Only rank 0 talks to the bridge. Every control decision (train on, synchronise, stop)
and every slice path travel from rank 0 to the others, so all ranks enter the same
collectives in the same order and none can deadlock.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs

from hypha.accelerate_executor.errors import ExecutorError

T = TypeVar("T")

# Rank 0 may wait a long time for the slowest worker's update while the others wait on it.
CONTROL_TIMEOUT = timedelta(hours=12)


def process_group_settings() -> InitProcessGroupKwargs:
    """accelerate's process-group settings: the long control timeout, and gloo for DeepSpeed
    over several processes without a GPU, where accelerate names no backend and so sets up
    a single process."""
    if (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        and int(os.environ.get("WORLD_SIZE", "1")) > 1
        and not torch.cuda.is_available()
    ):
        return InitProcessGroupKwargs(backend="gloo", timeout=CONTROL_TIMEOUT)
    return InitProcessGroupKwargs(timeout=CONTROL_TIMEOUT)


class Ranks:
    def __init__(self, accelerator: Accelerator) -> None:
        self.index = accelerator.process_index
        self.count = accelerator.num_processes
        self.is_main = self.index == 0
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.count:
            # Every process would think it is rank 0 and send its own pseudo-gradient, which
            # makes the parameter server average early and corrupts the round.
            raise ExecutorError(
                f"{launched} processes were launched but accelerate set up {self.count} "
                f"(distributed type {accelerator.distributed_type.value}); check the accelerate "
                "config: FSDP needs GPUs, on CPU use multi-cpu"
            )
        self._group: Any = None
        if self.count > 1:
            # Decisions travel over gloo on the CPU, never queued behind GPU work.
            self._group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)

    def share(self, value: T) -> T:
        """Returns rank 0's `value` on every rank."""
        if self.count == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def all(self, flag: bool) -> bool:
        """True on every rank when `flag` is True on every rank."""
        if self.count == 1:
            return flag
        value = torch.tensor(int(flag))
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self._group)
        return bool(value.item())

    def gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's `values` (as many on every rank), in rank order, on every rank: one
        all-gather of a few integers over the control group."""
        if self.count == 1:
            return [list(values)]
        mine = torch.tensor(values, dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self.count)]
        dist.all_gather(every, mine, group=self._group)
        return [[int(value) for value in tensor.tolist()] for tensor in every]

    def barrier(self) -> None:
        if self.count > 1:
            dist.barrier(group=self._group)

    def finish(self) -> None:
        """All ranks leave together: a rank that exits right after sending rank 0's last
        decision would cut the connection another rank is still reading it from. Torch's own
        threads outlive destroy_process_group() while a model wrapper holds the group: the
        process then leaves through entry.exit_without_teardown, which says why."""
        if self.count > 1:
            dist.barrier(group=self._group)
            dist.destroy_process_group()


def canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Maps every state-dict name to the first name of the same tensor, so that tied
    weights (an embedding shared with the LM head) are sent, merged and loaded once."""
    first_name: dict[int, str] = {}
    return {
        name: first_name.setdefault(id(tensor), name)
        for name, tensor in model.state_dict(keep_vars=True).items()
    }


class ModelWeights:
    """The model's full, unsharded weights: gathered to rank 0, loaded back from rank 0.

    Replicated models (one process, DDP) are read in place and loaded with copies into
    the live tensors (so the optimizer's state stays attached to them) and a broadcast.
    FSDP goes through torch.distributed.checkpoint's full-state-dict API. DeepSpeed reads
    the fp32 master weights, never a 16-bit gather, and loads both those and the model's
    own (maybe 16-bit, maybe partitioned) copy.
    """

    def __init__(
        self, accelerator: Accelerator, model: torch.nn.Module, names: dict[str, str]
    ) -> None:
        self._accelerator = accelerator
        self._model = model
        self._module = accelerator.unwrap_model(model)
        self._aliases = names
        self._unique = [name for name, canonical in names.items() if name == canonical]
        self._kind = _sharding(accelerator, model)
        self._is_main = accelerator.is_main_process

    @property
    def aliases(self) -> dict[str, str]:
        """Every state-dict name, mapped to the canonical name its tensor travels under."""
        return dict(self._aliases)

    @property
    def names(self) -> list[str]:
        return list(self._unique)

    def gather(self) -> dict[str, torch.Tensor]:
        """Rank 0: every unique tensor, full size (may be live views). Other ranks: {}."""
        if self._kind == DistributedType.FSDP:
            full = self._fsdp_state(full=None)
        elif self._kind == DistributedType.DEEPSPEED:
            full = self._deepspeed_gather()
        else:
            full = self._module.state_dict()
        return {name: full[name] for name in self._unique} if self._is_main else {}

    @torch.no_grad()
    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Loads rank 0's `weights` (unique names) into the model on every rank, in place."""
        if self._kind == DistributedType.FSDP:
            if self._is_main:  # tied weights go in under every name they have
                weights = {name: weights[canonical] for name, canonical in self._aliases.items()}
            self._fsdp_state(full=weights)
        elif self._kind == DistributedType.DEEPSPEED:
            self._deepspeed_load(weights)
        else:
            live = self._module.state_dict()
            for name in self._unique:
                if self._is_main:
                    live[name].copy_(weights[name])
                if self._accelerator.num_processes > 1:
                    dist.broadcast(live[name], src=0)

    def _fsdp_state(self, full: dict[str, Any] | None) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            set_model_state_dict,
        )

        if full is None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return dict(get_model_state_dict(self._model, options=options))
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self._model, full, options=options)
        return full

    def _deepspeed_gather(self) -> dict[str, torch.Tensor]:
        from deepspeed.utils import safe_get_full_fp32_param

        state = dict(self._module.state_dict())  # buffers, and names for the parameters
        for name, parameter in self._module.named_parameters():
            state[name] = safe_get_full_fp32_param(parameter)  # a collective: every rank calls it
        return state

    def _deepspeed_load(self, weights: dict[str, torch.Tensor]) -> None:
        from deepspeed.runtime.zero import GatheredParameters
        from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

        parameters = dict(self._module.named_parameters())
        buffers = dict(self._module.named_buffers())
        for name in self._unique:
            if name in parameters:
                value = safe_get_full_fp32_param(parameters[name])  # right shape and device
                if self._is_main:
                    value.copy_(weights[name])
                dist.broadcast(value, src=0)
                safe_set_full_fp32_param(parameters[name], value)
                # The master copy alone would reach the model only at the next optimizer
                # step: the round's first step would run on the old weights. Under ZeRO-3
                # the context gathers the partitions and re-partitions rank 0's values.
                with GatheredParameters([parameters[name]], modifier_rank=0):
                    parameters[name].data.copy_(value)
            elif name in buffers:
                if self._is_main:
                    buffers[name].copy_(weights[name])
                dist.broadcast(buffers[name], src=0)


def _sharding(accelerator: Accelerator, model: torch.nn.Module) -> DistributedType:
    """How the weights are laid out: FSDP by the model itself (however it was wrapped), the
    rest by accelerate's setup."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, (FSDPModule, FullyShardedDataParallel)):
        return DistributedType.FSDP
    return accelerator.distributed_type
