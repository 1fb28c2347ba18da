"""A job's executor's stdout, re-printed line by line as a Hypha worker reads it."""

from __future__ import annotations

from collections.abc import Callable

from hypha.standin.console import say, warn


class StdoutEcho:
    """Re-prints the child's stdout under `name`; like the worker, stops at the first
    non-UTF-8 line or when the child closes it, and then calls `stop(why)`, `why` saying
    what the still running child did (the worker kills it `kill_after_s` later)."""

    def __init__(self, name: str, stop: Callable[[str], None], kill_after_s: float) -> None:
        self._name = name
        self._stop = stop
        self._kill_after_s = kill_after_s
        self._pending = b""

    def feed(self, chunk: bytes) -> bool:
        """Takes the next chunk (b"" at its end); False once reading has stopped."""
        if not chunk:
            if self._pending and not self._echo(self._pending):
                return False
            self._stop("closed its stdout and is still running")
            return False
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        return all(self._echo(line) for line in lines)

    def _echo(self, line: bytes) -> bool:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            warn(
                self._name,
                "the executor wrote a non-UTF-8 line; stopped reading its stdout, killing it "
                f"in {self._kill_after_s:g} s",
            )
            self._stop("wrote a non-UTF-8 line and is still running")
            return False
        say(self._name, text.removesuffix("\r"))
        return True
