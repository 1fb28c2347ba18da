"""Where a loop's wall time goes: one clock, read at the end of each part (a lap), each
part's seconds summed, and the process's CPU time over the same span."""

from __future__ import annotations

import time


class Laps:
    """`lap(part)` adds the time since the last lap (or the start) to `part`. The parts
    named up front are there even if never lapped, in that order."""

    def __init__(self, *parts: str) -> None:
        self.parts: dict[str, float] = dict.fromkeys(parts, 0.0)
        self.started = self._last = time.perf_counter()
        self._cpu = time.process_time()

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        self.parts[part] = self.parts.get(part, 0.0) + now - self._last
        self._last = now

    def take(self, part: str) -> float:
        """`part`'s seconds so far; the part starts over from zero (a window that resets)."""
        seconds, self.parts[part] = self.parts.get(part, 0.0), 0.0
        return seconds

    @property
    def since_lap(self) -> float:
        """Wall time since the last lap (or the start): the part running now."""
        return time.perf_counter() - self._last

    @property
    def seconds(self) -> float:
        """Wall time since the start."""
        return time.perf_counter() - self.started

    @property
    def cpu_seconds(self) -> float:
        """CPU time the process took since the start, all its threads counted."""
        return time.process_time() - self._cpu
