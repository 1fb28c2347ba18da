"""What telemetry costs the training: the executor's samples/s with the OTEL_* variables set
(exporting to an OTLP/HTTP endpoint on loopback, the stand-in's receiver, which decodes
every request in this process on the same cores) against the same job without them.

    python -m bench.telemetry_overhead [--repeats 3] [--rounds 5] [--steps 15]

The demo job, one worker, the executor as a process under a local worker with one torch
thread; samples/s is the median over rounds 2.. of the executor's own metrics. Off and on
alternate within each repeat (which goes first alternates too), so the machine's drift
falls on both; the medians of the repeats and their ratio are printed, with each repeat's.
Exits 1 when a run failed, when the on runs exported nothing or the off runs anything.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from bench.errors import BenchError
from bench.status_delay import median_samples_per_s
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.demo import supervise
from hypha.standin.otlp_receiver import Receiver
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job


def one_run(options: RunOptions, work_base: Path, endpoint: str | None) -> float:
    """The executor's median samples/s over rounds 2.., exporting to `endpoint` if given."""
    env = {"OMP_NUM_THREADS": "1"}
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    with build_coordinator(Catalog.from_assets(ensure_assets()), options) as coordinator:
        worker = LocalWorker("bench-worker", preset("process"), work_base, env=env)
        failures: list[BaseException] = []

        def serve() -> None:
            try:
                serve_one_job(CoordinatorClient(coordinator.url), worker)
            except Exception as exc:
                failures.append(exc)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        supervise(coordinator, lambda: not thread.is_alive(), 900.0)
        record = coordinator.summary()["workers"]["bench-worker"]
    if failures or record["exit_code"] != 0:
        raise BenchError(f"the executor failed: {failures or record}")
    return median_samples_per_s(record)


def measure(repeats: int, options: RunOptions) -> tuple[list[float], list[float]]:
    """Each repeat's samples/s without telemetry and with it."""
    off: list[float] = []
    on: list[float] = []
    receiver = Receiver(("127.0.0.1", 0))
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="hy-bench-", dir="/tmp") as base:
            for repeat in range(repeats):
                order = [None, receiver.url] if repeat % 2 == 0 else [receiver.url, None]
                for endpoint in order:
                    before = len(receiver.items)
                    rate = one_run(options, Path(base), endpoint)
                    exported = len(receiver.items) - before
                    if (endpoint is None) != (exported == 0):
                        raise BenchError(
                            f"{exported} items exported with telemetry {'off' if endpoint is None else 'on'}"
                        )
                    (off if endpoint is None else on).append(rate)
    finally:
        receiver.shutdown()
        receiver.server_close()
    return off, on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry_overhead")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15, help="batches per round")
    args = parser.parse_args(argv)
    options = RunOptions.for_job(
        "causal-lm",
        workers=1,
        rounds=args.rounds,
        steps_per_round=args.steps,
        generation="alpha17",  # the side its figures (docs/performance.md) were measured on
    )
    try:
        # The executor's and the coordinator's lines would break up the result.
        with contextlib.redirect_stdout(sys.stderr):
            off, on = measure(args.repeats, options)
    except BenchError as exc:
        print(f"telemetry_overhead: {exc}", file=sys.stderr)
        return 1
    ratio = statistics.median(on) / statistics.median(off)
    print(
        f"samples/s without telemetry: {' '.join(f'{r:.1f}' for r in off)}; median {statistics.median(off):.1f}"
    )
    print(
        f"samples/s with telemetry:    {' '.join(f'{r:.1f}' for r in on)}; median {statistics.median(on):.1f}"
    )
    print(f"ratio with/without: {ratio:.3f} (medians of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
