"""The executor with accelerate's GPU-only gates lifted (lift_gpu_gates.py), run under
`accelerate launch --config_file fsdp.yaml` by the sharded tests."""

from __future__ import annotations

import os

import lift_gpu_gates  # noqa: F401  (lifts on import; this script's folder is on sys.path)

# A test that compares two runs bit for bit seeds each rank alike (dropout's draws).
if "EXECUTOR_TEST_SEED" in os.environ:
    import torch

    torch.manual_seed(int(os.environ["EXECUTOR_TEST_SEED"]))

from hypha.accelerate_executor.entry import exit_without_teardown
from hypha.accelerate_executor.training.main import main

exit_without_teardown(main())  # as `python -m hypha.accelerate_executor.training` leaves
