"""`hypha-accelerate local demo`: a coordinator and N local workers in one process.

Each worker is a thread that does what a Hypha worker does for one job (worker.py); the
executors are real processes (or containers through the shim), so everything between
them and this process crosses a real Unix socket.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType

from hypha.standin.console import say, warn
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.report import finish
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.errors import CoordinatorError, WorkerError
from hypha.standin.hub import HubStandin
from hypha.standin.worker.executor_entries import ExecutorEntry
from hypha.standin.worker.faults import Fault
from hypha.standin.worker.worker import LocalWorker, serve_one_job

# After a cancellation, how long the workers get to report their executors' end.
CANCEL_GRACE_S = 30.0


@contextmanager
def cancel_on_signals(coordinator: Coordinator) -> Iterator[None]:
    """SIGINT/SIGTERM cancel the run (the executors get SIGTERM) instead of killing this process."""

    def handler(signum: int, frame: FrameType | None) -> None:
        coordinator.cancel(f"interrupted by {signal.Signals(signum).name}")

    previous = {
        signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def supervise(coordinator: Coordinator, finished: Callable[[], bool], timeout_s: float) -> None:
    """Waits for `finished`, cancelling the run at the timeout; gives up a grace period later."""
    deadline = time.monotonic() + timeout_s
    give_up: float | None = None
    while not finished():
        coordinator.wait_finished(0.5)
        now = time.monotonic()
        if coordinator.cancelled is None and now > deadline:
            coordinator.cancel(f"timed out after {timeout_s:g} s")
        if coordinator.cancelled is not None:
            give_up = give_up or now + CANCEL_GRACE_S
            if now > give_up:
                warn(
                    coordinator.name,
                    "workers did not report their end in time; writing the report anyway",
                )
                return


def run_demo(
    options: RunOptions,
    executor: ExecutorEntry | Sequence[ExecutorEntry],
    *,
    out_dir: Path,
    work_base: Path,
    assets_dir: Path | None = None,
    owner: tuple[int, int] | None = None,
    timeout_s: float = 1800.0,
    keepalive_s: float = 5.0,
    strict_receive: bool = True,
    push_destination: tuple[str, str] | None = None,
    hub_standin: bool = False,
    faults: tuple[Fault, ...] = (),
) -> int:
    """`executor`: what every worker runs, or one entry per worker in order, the last one
    serving the rest (a pool of different executors, as on a real network).
    `push_destination` (repository, token): the job's model_destination, pushed to the
    Hub HF_ENDPOINT names, or with `hub_standin` to a loopback Hub stand-in (standin/hub.py)
    whose files are then listed."""
    say("demo", f"preparing the {options.job} job's model and data (generated once, then cached)")
    catalog = Catalog.from_assets(ensure_assets(assets_dir, options.asset_spec()))
    with ExitStack() as stack:
        hub = None
        push_env: dict[str, str] = {}
        if push_destination is not None and hub_standin:
            hub = stack.enter_context(HubStandin(push_destination[1]))
            # Where the executors push (the stand-in speaks basic LFS only, not xet).
            push_env = {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}
            say("demo", f"Hub stand-in at {hub.url}: the final model goes to {push_destination[0]}")
        pool = (executor,) if isinstance(executor, ExecutorEntry) else tuple(executor)
        code = _run(
            options, pool, catalog, out_dir, work_base, owner, timeout_s, keepalive_s,
            strict_receive, push_destination, push_env, faults,
        )  # fmt: skip
        if hub is not None and push_destination is not None:
            repo = hub.repos.get(push_destination[0])
            if repo is None or not repo.files:
                warn("demo", f"nothing was pushed to {push_destination[0]}")
                return 1
            listing = ", ".join(
                f"{name} ({len(data)} B)" for name, data in sorted(repo.files.items())
            )
            say("demo", f"pushed to {push_destination[0]}: {listing}")
    return code


def _run(
    options: RunOptions,
    pool: tuple[ExecutorEntry, ...],
    catalog: Catalog,
    out_dir: Path,
    work_base: Path,
    owner: tuple[int, int] | None,
    timeout_s: float,
    keepalive_s: float,
    strict_receive: bool,
    push_destination: tuple[str, str] | None,
    push_env: dict[str, str],
    faults: tuple[Fault, ...],
) -> int:
    coordinator = build_coordinator(catalog, options, push_destination=push_destination)
    coordinator.start()
    say(
        "demo",
        f"coordinator at {coordinator.url}: {options.job} job, {options.workers} workers x "
        f"{options.rounds} rounds of {options.target_samples} samples (batch {options.batch_size}), "
        f"{options.generation} bridges, executor"
        + ("s: " if len(pool) > 1 else ": ")
        + "; ".join(f"{entry.cmd} {' '.join(entry.args[:2])} ..." for entry in pool),
    )
    client = CoordinatorClient(coordinator.url)

    def run_worker(worker: LocalWorker) -> None:
        # The exit code reaches the coordinator, which judges the run.
        try:
            serve_one_job(client, worker)
        except (WorkerError, CoordinatorError) as exc:
            warn(worker.name, str(exc))

    # The workers share this machine: each executor gets its share of the cores, since
    # oversubscribed torch threads slow every executor down several times.
    threads_each = str(max(1, (os.cpu_count() or 1) // options.all_workers))
    workers = [
        LocalWorker(
            f"w{index + 1}",
            pool[min(index, len(pool) - 1)],
            work_base,
            owner=owner,
            keepalive_s=keepalive_s,
            strict_receive=strict_receive,
            env={"OMP_NUM_THREADS": threads_each, **push_env},
            faults=faults if index == 0 else (),
        )
        for index in range(options.all_workers)
    ]

    def run_late_worker(worker: LocalWorker) -> None:
        # Only the action protocol has late joiners (RunOptions refuses them otherwise).
        if coordinator.wait_for_round(1, timeout_s):
            say("demo", f"{worker.name} joins after round 1 (a late joiner)")
            run_worker(worker)

    # Daemons, so a worker stuck past the grace period cannot keep the process alive.
    threads = [
        threading.Thread(
            target=run_worker if index < options.workers else run_late_worker,
            args=(worker,),
            name=worker.name,
            daemon=True,
        )
        for index, worker in enumerate(workers)
    ]
    try:
        with cancel_on_signals(coordinator):
            for thread in threads:
                thread.start()
            supervise(
                coordinator, lambda: not any(thread.is_alive() for thread in threads), timeout_s
            )
        summary = coordinator.summary()
    finally:
        coordinator.stop()
    return 0 if finish(summary, out_dir, prefix="demo") else 1
