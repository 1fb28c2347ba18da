"""SIGTERM and SIGINT as something the main thread waits on, next to "the job ended".

The handlers only record the signal: stopping a container means HTTP calls, which must
not run inside a signal handler (it may interrupt the same connection pool mid-request).
The main thread blocks on a pipe that the signal and the thread seeing the job end both
write to.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from types import FrameType


class Interrupts:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.signum: int | None = None
        self.ended = False
        # The kernel may deliver the signal to any thread; Python runs the handler in the
        # main thread only at its next bytecode, which never comes while it sits in select().
        # The C-level handler writes to this fd whichever thread took the signal.
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    def job_ended(self) -> None:
        """Called by the thread that saw the job end."""
        self.ended = True  # before the byte: the main thread reads the flag once woken
        with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups already
            os.write(self._write, b"\0")

    def wait_for_end(self) -> None:
        """Blocks until the job has ended or SIGTERM/SIGINT came, whichever is first."""
        while not self.ended and self.signum is None:
            select.select([self._read], [], [])
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 4096)

    @property
    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a process it ended: 143 SIGTERM, 130 SIGINT."""
        assert self.signum is not None
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        assert self.signum is not None
        return signal.Signals(self.signum).name
