"""Timing that a busy 2-core machine cannot easily fool: the things compared run in
alternation, after a warm-up, and each is summarised by its median; and CPU accounting,
to tell what other processes took from a measurement and what the stand-in costs."""

from __future__ import annotations

import bisect
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable


def interleaved_medians(
    actions: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Runs every action `warmup` times untimed, then `repeats` times each in turn;
    returns each action's median wall time in seconds."""
    for _ in range(warmup):
        for action in actions.values():
            action()
    times: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            started = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(samples) for name, samples in times.items()}


def own_cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (executors included)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_cpu_seconds() -> float | None:
    """CPU time every process on the machine has used since boot; None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...: all but idle and iowait.
    busy = sum(int(value) for index, value in enumerate(fields[1:9]) if index not in (3, 4))
    return busy / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples this process's CPU time (all its threads) in the background, so that the
    CPU spent inside given wall-clock windows can be read afterwards."""

    def __init__(self, period_s: float = 0.05) -> None:
        self._period_s = period_s
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            self._samples.append((time.time(), time.process_time()))
            if self._stop.wait(self._period_s):
                return

    def cpu_between(self, start: float, end: float) -> float:
        """CPU seconds used between two time.time() instants, interpolated."""
        return self._cpu_at(end) - self._cpu_at(start)

    def _cpu_at(self, instant: float) -> float:
        samples = self._samples
        index = bisect.bisect_left(samples, instant, key=lambda sample: sample[0])
        if index == 0:
            return samples[0][1]
        if index == len(samples):
            return samples[-1][1]
        (t0, cpu0), (t1, cpu1) = samples[index - 1], samples[index]
        return cpu0 + (cpu1 - cpu0) * (instant - t0) / (t1 - t0)
