"""The action protocol's samples/s with the scheduler's answers at once and 50 ms late: the
executor with its speculative step against the same executor blocking on each action, and
with `auto`, which tries both in turns as it runs and speculates only where that pays.

    python bench/action_latency.py [--batches N] [--repeats N] [--delays 0,50] [--smoke]

Each run is the executor as a process (`--speculative-step on`, `off`, `auto`) against the
stand-in's action-era bridge on a real Unix socket, in this process, whose scheduler answers
every status with `execute-batch{1}` (one round trip per batch, as upstream's train
scheduler plays it) until the run's batches are done, then `terminate`; every answer is
held back by the delay, as a remote scheduler's network hop would. Samples/s is counted at
the bridge, from the status of the warm-up's last batch to the last one's. The runs go in
turns (repeat, delay, mode), and each figure is the median of its repeats; the ratios are
speculative over blocking at the same delay, and auto over the better of the two. A run is
160 batches by default so that auto, after its warm-up turn and its trial (40 batches,
training/actions/speculative.py), runs mostly the way it chose, as a job's thousands of batches do.

The model is the stand-in's demo GPT-2 (0.47M parameters, 64 tokens, batch 8), whose step
takes about 40-70 ms on one core of this 2-core machine: comparable to the 50 ms delay. The
executor runs torch on one thread (OMP_NUM_THREADS=1), leaving the other core to the bridge
and the scheduler, which share the executor's machine here and not on a real network.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.errors import BenchError
from bench.models import DEMO, MICRO, Shape
from hypha.accelerate_executor.protocol.actions.messages import (
    ACTION_REQUEST,
    BatchCompletedStatus,
    ExecuteBatch,
    Terminate,
    action_response,
)
from hypha.standin.actions.bridge_http import ActionBridgeServer
from hypha.standin.coordinator.in_process import InProcessBackend
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets

EXECUTOR = [sys.executable, "-m", "hypha.accelerate_executor.training"]
MODES = ("on", "off", "auto")  # --speculative-step
TARGETS = {0: 0.98, 50: 1.5}  # speculative / blocking, by delay in ms
WARMUP_BATCHES = 3
BATCH_SIZE = 8


class LateScheduler(InProcessBackend):
    """The stand-in's model store and data node, with a scheduler that answers each status
    `delay_s` late with `execute-batch{1}` until `batches` are done; it notes when each
    batch-completed status arrived."""

    def __init__(self, coordinator: Coordinator, job_id: str, batches: int, delay_s: float):
        super().__init__(coordinator, job_id)
        self.batches, self.delay_s = batches, delay_s
        self.completed: list[float] = []
        self._lock = threading.Lock()

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        details = ACTION_REQUEST.validate_python(request).status.details
        with self._lock:
            if isinstance(details, BatchCompletedStatus):
                self.completed.extend([time.perf_counter()] * details.batches)
            done = len(self.completed) >= self.batches
        time.sleep(self.delay_s)
        return action_response(request["job_id"], Terminate() if done else ExecuteBatch(1))


def one_run(catalog: Catalog, mode: str, delay_ms: int, batches: int, work: Path) -> float:
    """Samples/s of one executor run after its warm-up."""
    coordinator = build_coordinator(catalog, RunOptions(workers=1, generation="actions"))
    job_json = json.dumps(coordinator.assign_job("w1"))
    job_id = json.loads(job_json)["job_id"]
    scheduler = LateScheduler(coordinator, job_id, batches + WARMUP_BATCHES, delay_ms / 1e3)
    work.mkdir()
    env = {
        **os.environ,
        "JOB_JSON": job_json,
        "HYPHA_SPECULATIVE_STEP": mode,
        "OMP_NUM_THREADS": "1",
    }
    with ActionBridgeServer(work, scheduler, job_id=job_id) as bridge:
        done = subprocess.run(
            [*EXECUTOR, "--socket", str(bridge.socket_path), "--work-dir", str(work)],
            env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"the executor failed (speculative step {mode}): {last}")
    times = scheduler.completed[WARMUP_BATCHES - 1 :]
    return BATCH_SIZE * (len(times) - 1) / (times[-1] - times[0])


def measure(
    shape: Shape, batches: int, repeats: int, delays_ms: list[int]
) -> dict[int, dict[str, list[float]]]:
    """Samples/s of each run, by delay and mode, the runs in turns."""
    assets = ensure_assets(spec=shape.asset_spec())
    catalog = Catalog.from_assets(assets)
    rates: dict[int, dict[str, list[float]]] = {d: {m: [] for m in MODES} for d in delays_ms}
    with tempfile.TemporaryDirectory(prefix="hy-", dir="/tmp") as base:  # short socket paths
        for repeat in range(repeats):
            for delay in delays_ms:
                for mode in MODES:
                    work = Path(base) / f"{repeat}-{delay}-{mode}"
                    rates[delay][mode].append(one_run(catalog, mode, delay, batches, work))
                    print(f"repeat {repeat + 1}, {delay} ms, {mode}: done", file=sys.stderr)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=160, help="timed batches a run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per delay and mode")
    parser.add_argument("--delays", default="0,50", help="answer delays in ms (default 0,50)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 3 batches, 1 repeat")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args(argv)
    delays = [int(value) for value in arguments.delays.split(",")]
    shape, batches, repeats = DEMO, arguments.batches, arguments.repeats
    if arguments.smoke:
        shape, batches, repeats = MICRO, 3, 1
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the stand-in's own lines
            rates = measure(shape, batches, repeats, delays)
    except BenchError as exc:
        print(f"action latency: {exc}", file=sys.stderr)
        return 1
    print(
        f"action latency: GPT-2 {shape.name}, batch {BATCH_SIZE}, {batches} batches a run of "
        f"execute-batch{{1}}, median of {repeats}, executor torch threads 1"
    )
    results = []
    for delay, by_mode in rates.items():
        on, off, auto = (statistics.median(by_mode[mode]) for mode in MODES)
        target = TARGETS.get(delay)
        verdict = "" if target is None else f" (target >= {target}: "
        verdict += "" if target is None else ("met)" if on / off >= target else "GAP)")
        print(
            f"answers {delay} ms late: speculative {on:.1f} samples/s, blocking {off:.1f} "
            f"samples/s, ratio {on / off:.2f}{verdict}; auto {auto:.1f} samples/s, "
            f"{auto / max(on, off):.2f} of the better"
        )
        results.append(
            {
                "delay_ms": delay,
                "runs": by_mode,
                "ratio": on / off,
                "auto_of_better": auto / max(on, off),
                "target": target,
            }
        )
    if arguments.json:
        arguments.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
