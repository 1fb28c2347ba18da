"""The executor with accelerate's one GPU-only gate for FSDP lifted, run under `accelerate
launch --config_file fsdp.yaml` by test_clipping.py.

accelerate applies FSDP only when its distributed type is a multi-GPU one; on the CPU it sets
MULTI_CPU and trains unsharded. Here, once the Accelerator is set up, its MULTI_CPU state
becomes FSDP with the plugin the config describes, as it would be on GPUs: the model is then
sharded by FSDP2 over the gloo processes, and the executor runs as it does on a GPU host.
"""

from __future__ import annotations

import os
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

_accelerator_init = Accelerator.__init__


def _fsdp_on_cpu(self: Accelerator, *args: Any, **kwargs: Any) -> None:
    _accelerator_init(self, *args, **kwargs)
    if self.state.distributed_type == DistributedType.MULTI_CPU:
        # Both shared states: every later AcceleratorState() copies PartialState's over its own.
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.state.distributed_type = DistributedType.FSDP
        self.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the config's variables


Accelerator.__init__ = _fsdp_on_cpu  # type: ignore[method-assign]

# A test that compares two runs bit for bit seeds each rank alike (dropout's draws).
if "EXECUTOR_TEST_SEED" in os.environ:
    import torch

    torch.manual_seed(int(os.environ["EXECUTOR_TEST_SEED"]))

from hypha.accelerate_executor.entry import exit_without_teardown  # noqa: E402
from hypha.accelerate_executor.training.main import main  # noqa: E402

exit_without_teardown(main())  # as `python -m hypha.accelerate_executor.training` leaves
