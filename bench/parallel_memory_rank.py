"""One rank of bench/parallel_memory.py: the executor's training entry point, accelerate's
GPU-only gates lifted as a GPU host would lift them, and the rank's peak resident memory
written down once the job is over.

    accelerate launch --config_file CONFIG --num_processes N ... parallel_memory_rank.py ARGS

Run where the launcher would run `-m hypha.accelerate_executor.training` (same arguments),
with these variables:

  HYPHA_BENCH_PEAKS  a folder: `rank-<RANK>.json` gets this process's VmHWM and VmRSS (kB)
                     from /proc/self/status, read right after the executor's main() returned,
                     so the figure covers the whole job (load, rounds, syncs, export) and does
                     not rely on anything the executor itself reports
  HYPHA_BENCH_LIFT   comma-separated, any of:
                     fsdp  accelerate sets MULTI_CPU on the CPU whatever the config says and
                           trains unsharded; once the Accelerator is set up its state becomes
                           FSDP with the config's plugin, as tests/sharding/executor_fsdp_on_cpu.py
                           does, so that FSDP2 shards the model over the gloo processes
                     tp    `Accelerator.multi_device`, which accelerate's tensor-parallel path
                           asks, leaves MULTI_CPU out; it answers True for MULTI_CPU when a
                           tensor-parallel mesh is configured, as it would for MULTI_GPU

This file is the bench's own copy of that lifting, so that the benchmark does not depend on a
test helper that may move; it patches accelerate only, never the executor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

LIFTS = frozenset(filter(None, os.environ.get("HYPHA_BENCH_LIFT", "").split(",")))


def lift_fsdp() -> None:
    accelerator_init = Accelerator.__init__

    def fsdp_on_cpu(self: Accelerator, *args: Any, **kwargs: Any) -> None:
        accelerator_init(self, *args, **kwargs)
        if self.state.distributed_type == DistributedType.MULTI_CPU:
            # Both shared states: every later AcceleratorState() copies PartialState's over its own.
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.state.distributed_type = DistributedType.FSDP
            self.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the config's variables

    Accelerator.__init__ = fsdp_on_cpu


def lift_tp() -> None:
    multi_device = Accelerator.multi_device

    def multi_device_on_cpu(self: Accelerator) -> bool:
        if multi_device.fget(self):
            return True
        # Only with a tensor-parallel mesh: plain MULTI_CPU keeps accelerate's own DDP path
        # (a CPU module takes no device_ids, which the multi-device path would pass).
        config = getattr(self, "parallelism_config", None)
        return (
            self.distributed_type == DistributedType.MULTI_CPU
            and config is not None
            and bool(config.tp_enabled)
        )

    Accelerator.multi_device = property(multi_device_on_cpu)


def status_kb(*fields: str) -> dict[str, int]:
    """The given fields of /proc/self/status, in kB (Linux reports them so)."""
    found: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            found[name] = int(value.split()[0])
    return found


def write_peak(code: int) -> None:
    folder = os.environ.get("HYPHA_BENCH_PEAKS")
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    record = {"rank": int(rank), "pid": os.getpid(), "exit_code": code}
    record.update(status_kb("VmHWM", "VmRSS"))
    path = Path(folder) / f"rank-{rank}.json"
    # Written beside and renamed, so that the bench never reads half a record.
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    partial.rename(path)


def run() -> None:
    if "fsdp" in LIFTS:
        lift_fsdp()
    if "tp" in LIFTS:
        lift_tp()
    from hypha.accelerate_executor.entry import exit_without_teardown
    from hypha.accelerate_executor.training.main import main

    code = 1
    try:
        code = main()
    finally:
        write_peak(code)
    exit_without_teardown(code)  # as `python -m hypha.accelerate_executor.training` leaves


if __name__ == "__main__":
    run()
