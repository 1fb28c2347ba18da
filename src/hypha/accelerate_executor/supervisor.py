"""One child in its own process group: stop requests passed on, a grace period, then SIGKILL.

Torch-free and stdlib-only. The launcher (the image's entrypoint), the shim's host mode and
the local worker run their child through `Supervisor`; the shim's container path shares its
`Interrupts`, `GRACE_S` and exit-status mapping.

Exit statuses read as a shell shows them: a child's own code, 128 + N for a death by signal
N (`exit_status`), 128 + N for a job cancelled by signal N (`signal_exit_status`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO

from hypha.accelerate_executor.errors import EXIT_SIGNAL_BASE

# The Hypha worker SIGKILLs 5 s after its SIGTERM, and a cancelled job should be gone in
# 3: what a stopped child gets before everything left in its group is killed.
GRACE_S = 2.5
# After the child's exit, how long its last output may take to arrive: a grandchild that
# still holds the stream must not hold up the supervisor.
DRAIN_S = 2.0
TERMINATING = (signal.SIGTERM, signal.SIGINT)


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: a death by signal N is 128 + N."""
    return EXIT_SIGNAL_BASE - returncode if returncode < 0 else returncode


def signal_exit_status(signum: int) -> int:
    """What a process cancelled by `signum` exits with: 143 for SIGTERM, 130 for SIGINT."""
    return EXIT_SIGNAL_BASE + signum


class Interrupts:
    """A stop request (a signal, or `stop()` from any thread) as something one thread waits
    on, next to "the job ended".

    Signal handlers only record the signal: what stopping takes (HTTP calls to the engine,
    say) must not run inside a handler. The waiting thread blocks on a pipe that the
    signal, `stop()` and the thread seeing the job end all write to.
    """

    def __init__(self, signals: Iterable[int] = TERMINATING) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.signum: int | None = None
        self.stopping = False
        self.ended = False
        signals = tuple(signals)
        if signals:
            # The kernel may deliver a signal to any thread; Python runs the handler in the
            # main thread only at its next bytecode, which never comes while it sits in
            # select(). The C-level handler writes to this fd whichever thread took it.
            signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            for signum in signals:
                signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stop(signum)

    def stop(self, signum: int | None) -> None:
        """Asks for the stop; `signum` is what the child gets first (None: nothing, only the
        SIGKILL after the grace). The first request counts."""
        if not self.stopping:
            self.signum, self.stopping = signum, True
        self._wake()

    def job_ended(self) -> None:
        """Called by the thread that saw the job end."""
        self.ended = True  # before the byte: the waiting thread reads the flag once woken
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups already
            os.write(self._write, b"\0")

    def wait_for_end(self, timeout_s: float | None = None) -> bool:
        """Blocks until the job ended or a stop was asked for (or the timeout); True if either."""
        while not self.ended and not self.stopping:
            if not select.select([self._read], [], [], timeout_s)[0]:
                return False
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 4096)
        return True

    @property
    def exit_code(self) -> int:
        assert self.signum is not None
        return signal_exit_status(self.signum)

    @property
    def signal_name(self) -> str:
        assert self.signum is not None
        return signal.Signals(self.signum).name


@dataclass(frozen=True)
class StopPolicy:
    """How a stop reaches the child. Ours: the whole group, GRACE_S, and nothing of the
    group outlives its leader. A Hypha worker's (the local worker plays one): the child
    alone, 5 s, and what the child started is its own business."""

    whole_group: bool = True
    grace_s: float = GRACE_S
    kill_leftovers: bool = True


class Supervisor:
    """Runs one child in a new session (its own process group) to its end or to a stop.

    `start` spawns it (stdout piped to `on_output` chunk by chunk, b"" at its end, when
    given; stderr likewise to `on_error`); `wait` blocks until it exits or `interrupts` asks
    for a stop, passes the stop on under the policy, and returns the child's exit status.
    """

    def __init__(self, interrupts: Interrupts, policy: StopPolicy = StopPolicy()) -> None:
        self.interrupts = interrupts
        self.policy = policy
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False  # True when the grace ran out and SIGKILL ended it
        self._reader: threading.Thread | None = None
        self._error_reader: threading.Thread | None = None
        self._exited = threading.Event()

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        on_output: Callable[[bytes], object] | None = None,
        on_error: Callable[[bytes], object] | None = None,
        stdin: int | None = subprocess.DEVNULL,
        user: tuple[int, int] | None = None,
        on_spawn: Callable[[int], object] | None = None,
    ) -> subprocess.Popen[bytes]:
        """`user` (uid, gid): the child runs as that user, without this one's groups.
        `on_spawn(pid)` runs before any of the child's output is handed on, so that whoever
        reads that output cannot act on it before the caller has recorded the child."""
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=stdin,
            stdout=subprocess.PIPE if on_output else None,
            stderr=subprocess.PIPE if on_error else None,
            start_new_session=True,
            user=user[0] if user else None,
            group=user[1] if user else None,
            extra_groups=[] if user else None,
        )
        self.process = process
        if on_spawn is not None:
            on_spawn(process.pid)
        threading.Thread(target=self._await_exit, args=(process.pid,), daemon=True).start()
        if on_output is not None:
            assert process.stdout is not None
            self._reader = threading.Thread(
                target=_read, args=(process.stdout, on_output), daemon=True
            )
            self._reader.start()
        if on_error is not None:
            assert process.stderr is not None
            self._error_reader = threading.Thread(
                target=_read, args=(process.stderr, on_error), daemon=True
            )
            self._error_reader.start()
        return process

    def run(self, argv: Sequence[str], env: Mapping[str, str]) -> int:
        self.start(argv, env, stdin=None)
        return self.wait()

    def wait(self) -> int:
        process = self.process
        assert process is not None
        self.interrupts.wait_for_end()
        if not self._exited.is_set():
            if self.interrupts.signum is not None:
                self._signal(self.interrupts.signum, self.policy.whole_group)
            if not self._exited.wait(self.policy.grace_s):
                self.killed = True
                self._signal(signal.SIGKILL, self.policy.whole_group)
        if self.policy.kill_leftovers:
            # Not reaped yet: while the leader is a zombie its pid, the group's id, stays
            # taken, so signalling the group cannot hit a stranger.
            self._signal(signal.SIGKILL, whole_group=True)
        code = process.wait()
        for reader in (self._reader, self._error_reader):
            if reader is not None:
                reader.join(DRAIN_S)
        return exit_status(code)

    @property
    def output_held(self) -> bool:
        """Whether something the child started still holds its stdout after `wait`."""
        return self._reader is not None and self._reader.is_alive()

    def _await_exit(self, pid: int) -> None:
        # ChildProcessError: `wait` reaped the child before this thread got to look.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        self._exited.set()
        self.interrupts.job_ended()

    def _signal(self, signum: int, whole_group: bool) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(self.process.pid, signum)
            else:
                os.kill(self.process.pid, signum)


def _read(stream: IO[bytes], on_output: Callable[[bytes], object]) -> None:
    """Hands the child's output on chunk by chunk until its end (b"") or until `on_output`
    returns False."""
    with stream:
        while True:
            chunk = os.read(stream.fileno(), 65536)
            if on_output(chunk) is False or not chunk:
                return
