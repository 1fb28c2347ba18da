"""Shim overhead: `hypha-accelerate run` against `docker run` of the same container.

    python bench/shim_bench.py [--repeats N]

Both launch the same container (the worker-config docker entry renders the shim's own
container spec) of the shim tests' stand-in executor image, which prints a few lines and
exits. Alternating, after one untimed warm-up of each, N times each:

  created     launcher spawned -> the engine's `create` event for its container
  started     launcher spawned -> the engine's `start` event
  first line  launcher spawned -> the container's first stdout line, read from the launcher
  exited      launcher spawned -> launcher exited, its container gone
  peak RSS    of the launcher process (the shim with its watchdog child; the docker CLI)

Medians are printed with shim - docker-run differences and shim / docker-run ratios. The
shim's budget: start-up and container creation well under a second on top of Docker's own
time, which is the docker-run column.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The shim tests' stand-in executor image and job set-up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from shim_harness import JOB_LABEL, WorkerJob, ensure_test_image, shim_command


@dataclass
class Run:
    created: float
    started: float
    first_line: float
    exited: float
    peak_rss_mib: float


@dataclass
class Events:
    """The engine's create/start events of containers labelled with a job id, by job id."""

    api: Any
    times: dict[tuple[str, str], float] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)

    def follow(self) -> None:
        stream = self.api.events(
            filters={"type": "container", "event": ["create", "start"], "label": JOB_LABEL},
            decode=True,
        )
        self.ready.set()
        for event in stream:
            job = event["Actor"]["Attributes"].get(JOB_LABEL)
            self.times[(job, event["Action"])] = event["timeNano"] / 1e9

    def wait_for(self, job: str, action: str) -> float:
        deadline = time.monotonic() + 10
        while (job, action) not in self.times:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {action} event for job {job}")
            time.sleep(0.01)
        return self.times[(job, action)]


@contextmanager
def worker_job() -> Iterator[WorkerJob]:
    """A job's work dir, owned by this user, its bridge socket accepting and hanging up."""
    path = Path(tempfile.mkdtemp(prefix="hypha-bench-", dir="/tmp"))
    job = WorkerJob(path, "", os.getuid(), os.getgid())
    job.serve_bridge()
    job.plan(lines=3)
    try:
        yield job
    finally:
        job.bridge_away()
        shutil.rmtree(path, ignore_errors=True)


def docker_run_command(image: str, job: WorkerJob) -> list[str]:
    """What a worker runs from `hypha-accelerate worker-config --mode docker`, substituted."""
    from hypha.accelerate_executor.shim.container_spec import (
        ContainerSpec,
        default_shm_size,
        launcher_args,
    )

    spec = ContainerSpec(
        image=image,
        command=launcher_args(str(job.socket_path), str(job.work_dir), job.job_json),
        user=f"{job.uid}:{job.gid}",
        work_dir=str(job.work_dir),
        work_dir_source=str(job.work_dir),
        shm_size=default_shm_size("cpu"),
        labels={JOB_LABEL: job.job_id},
    )
    return ["docker", *spec.docker_run_args()]


def measure(command: list[str], job_id: str, events: Events) -> Run:
    start = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()
    first_line = time.time() - start
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    exited = time.time() - start
    if os.waitstatus_to_exitcode(status) != 0:
        error = process.stderr.read() if process.stderr else out
        raise RuntimeError(f"{command[0]} failed: {error.decode(errors='replace').strip()}")
    return Run(
        created=events.wait_for(job_id, "create") - start,
        started=events.wait_for(job_id, "start") - start,
        first_line=first_line,
        exited=exited,
        peak_rss_mib=usage.ru_maxrss / 1024,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if shutil.which("docker") is None:
        print("shim_bench: no docker CLI on PATH", file=sys.stderr)
        return 1
    from hypha.accelerate_executor.errors import ShimError
    from hypha.accelerate_executor.shim.engine import connect

    try:
        api = connect()
    except ShimError as exc:
        print(f"shim_bench: {exc}", file=sys.stderr)
        return 1
    image = ensure_test_image(api)
    events = Events(connect())
    threading.Thread(target=events.follow, daemon=True).start()
    events.ready.wait()
    runs: dict[str, list[Run]] = {"docker run": [], "shim": []}
    with worker_job() as job:
        for repeat in range(args.repeats + 1):
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
            for name in order:
                job.job_id = str(uuid.uuid4())
                command = (
                    shim_command(*job.run_args(image=image))
                    if name == "shim"
                    else docker_run_command(image, job)
                )
                run = measure(command, job.job_id, events)
                if repeat > 0:  # the first round warms caches up
                    runs[name].append(run)
            print(f"round {repeat}/{args.repeats}", file=sys.stderr)
    print(f"shim overhead: image {image}, {args.repeats} runs each, medians")
    print(f"  {'':<16}{'docker run':>12}{'shim':>10}{'shim - docker run':>20}{'ratio':>8}")
    for metric, unit in (
        ("created", "s"),
        ("started", "s"),
        ("first_line", "s"),
        ("exited", "s"),
        ("peak_rss_mib", "MiB"),
    ):
        base = statistics.median(getattr(r, metric) for r in runs["docker run"])
        shim = statistics.median(getattr(r, metric) for r in runs["shim"])
        label = f"{metric.replace('_', ' ').replace(' mib', '')} ({unit})"
        print(f"  {label:<16}{base:>12.3f}{shim:>10.3f}{shim - base:>+20.3f}{shim / base:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
