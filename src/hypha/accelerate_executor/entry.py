"""What every command's `main` shares: arguments refused in one line, and one way out.

A `main` parses its arguments with OneLineArgumentParser and hands its body to `run_main`,
which turns the failures a user can cause into one line on stderr and an exit code
(errors.py lists them): the same for every entry point. A process that ran torch.distributed
leaves with `exit_without_teardown(code)`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from hypha.accelerate_executor import telemetry
from hypha.accelerate_executor.errors import (
    EXIT_FAILED,
    EXIT_SIGNAL_BASE,
    Cancelled,
    HyphaError,
    UsageError,
)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose complaint is a UsageError, which `run_main` prints as one line,
    `PROG: message (see --help)`, and exits 2 with (argparse's own is the usage, then a
    line, and a SystemExit)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def say_error(prog: str, line: str) -> None:
    global _last_error
    _last_error = f"{prog}: {line}"
    print(_last_error, file=sys.stderr, flush=True)
    telemetry.log_line(f"{prog}: {line}", "ERROR")


def run_main(
    prog: str, body: Callable[[], int], unexpected: Callable[[Exception], str] | None = None
) -> int:
    """`body()`'s exit code. A HyphaError ends as `PROG: message` on stderr and its exit
    code; SIGTERM (Cancelled) and Ctrl-C as `PROG: cancelled (SIGTERM)` or `interrupted`
    and 128 + the signal. With `unexpected`, any other exception (a bug, or a library's
    refusal) ends as `PROG: unexpected(exc)` and 1 instead of a traceback."""
    try:
        return body()
    except HyphaError as exc:
        say_error(prog, f"{exc.prefix}{exc}")
        return exc.exit_code
    except Cancelled as exc:
        say_error(prog, "cancelled (SIGTERM)")
        return exc.exit_code
    except KeyboardInterrupt:
        say_error(prog, "interrupted")
        return EXIT_SIGNAL_BASE + signal.SIGINT
    except Exception as exc:
        if unexpected is None:
            raise
        say_error(prog, unexpected(exc))
        return EXIT_FAILED


def exit_without_teardown(code: int) -> NoReturn:
    """Ends the process now with `code`, once everything written is out, skipping the
    interpreter's teardown. How the training ranks leave, whatever the job's outcome.

    Why: torch's gloo worker threads (ProcessGroupGloo::runLoop) outlive
    destroy_process_group() as long as something holds the group, and the DDP, FSDP and
    DeepSpeed wrappers do until the interpreter frees them. A worker frees a finished
    collective after the rank that waited for it has moved on: the closing barrier, and with
    it the broadcasts it kept (Ranks.share's last decision), whose tensors were made in Python
    and take the GIL to be freed. When a busy machine delays that worker until the interpreter
    is finalizing, CPython ends the thread with pthread_exit, the unwinding meets a C++
    destructor (~AsyncWork), which must not throw, and std::terminate aborts the rank
    ("terminate called without an active exception", exit -6) after its job finished:
    `accelerate launch` exits 1 and the worker reports the job failed. A rank that does not
    finalize cannot meet this; its outcome is decided and said, so the teardown has nothing
    left to do. bench/exit_race.py holds the race open; bench/exit_repetition.py counts exits.
    """
    try:
        note_rank_exit(code)
        telemetry.flush_at_exit()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: no reader
                stream.flush()
        # Lines a C library printed through stdio: its exit would flush them, _exit does not.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)
    finally:
        # The outcome stands even if a signal (SIGTERM raises Cancelled) cuts the flushing short.
        os._exit(code)


# Set by the launcher for the ranks it starts: a folder each rank that fails writes its exit
# code and its one line to, as a file named by its RANK. torchrun folds every rank's failure
# into its own exit 1 and ends stderr with its summary; the launcher gives the job the code
# and the line the ranks chose (launcher/command.py).
RANK_EXITS_ENV = "HYPHA_RANK_EXITS"
_last_error = ""  # the last line say_error said


def note_rank_exit(code: int) -> None:
    folder = os.environ.get(RANK_EXITS_ENV)
    if code and folder:
        path = os.path.join(folder, os.environ.get("RANK", "0"))
        with contextlib.suppress(OSError), open(path, "w") as file:
            file.write(f"{code}\n{_last_error}")


def ranks_exit(folder: str) -> tuple[int, str] | None:
    """The exit code and line of the lowest rank that wrote them into `folder` (rank 0's
    decides a job's outcome where it wrote one); None when no rank did."""
    said: dict[int, tuple[int, str]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, name)) as f:
                code, _, line = f.read().partition("\n")
                said[int(name)] = (int(code), line)
    return said[min(said)] if said else None
