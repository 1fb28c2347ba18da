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

accelerate's GPU-only gates are lifted as the tests lift them (tests/sharding/lift_gpu_gates.py:
FSDP under an FSDP config, a parallelism config over several processes), which patches
accelerate only, never the executor.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# The tests' lifting of the gates, on import: one copy of it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sharding"))
import lift_gpu_gates  # type: ignore[import-not-found]  # noqa: F401


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
