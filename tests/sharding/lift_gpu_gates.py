"""The executor with accelerate's GPU-only gates lifted, as a GPU host lifts them: imported by
executor_on_cpu_as_on_gpus.py, or at every start of Python by gpu_gates_lifted/sitecustomize.py
(on PYTHONPATH: the project's launcher then starts ranks that run as on GPUs).

accelerate gates two things to accelerators, and on the CPU sets MULTI_CPU instead:
- FSDP: applied only when the distributed type is a multi-GPU one, else it trains unsharded.
  Here, once the Accelerator is set up, its MULTI_CPU state becomes FSDP with the plugin the
  config describes, as it would be on GPUs: the model is then sharded by FSDP2 over the gloo
  processes.
- A ParallelismConfig over several processes (tensor parallelism): `Accelerator.multi_device`
  counts only accelerator types, and the config is refused for MULTI_CPU. Here it counts
  MULTI_CPU too where such a config is set, which is all the gate does: DTensor's tensor
  parallelism runs over gloo.
The executor then runs as it does on a GPU host.
"""

from __future__ import annotations

import os
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

_multi_device = Accelerator.multi_device.fget
assert _multi_device is not None


def _multi_device_on_cpu(self: Accelerator) -> bool:
    # Only with a parallelism config over several processes: plain MULTI_CPU keeps
    # accelerate's own DDP path (a CPU module takes no device_ids, which the multi-device
    # path would pass).
    config = getattr(self, "parallelism_config", None)
    return bool(_multi_device(self)) or (
        self.use_distributed
        and self.distributed_type == DistributedType.MULTI_CPU
        and config is not None
        and config.total_size > 1
    )


Accelerator.multi_device = property(_multi_device_on_cpu)  # type: ignore[method-assign,assignment]

_accelerator_init = Accelerator.__init__


def _fsdp_on_cpu(self: Accelerator, *args: Any, **kwargs: Any) -> None:
    _accelerator_init(self, *args, **kwargs)
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
    if fsdp and self.state.distributed_type == DistributedType.MULTI_CPU:
        # Both shared states: every later AcceleratorState() copies PartialState's over its own.
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.state.distributed_type = DistributedType.FSDP
        self.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the config's variables


Accelerator.__init__ = _fsdp_on_cpu  # type: ignore[method-assign]
