"""What every command's `main` shares: arguments refused in one line, and one way out.

A `main` parses its arguments with OneLineArgumentParser and hands its body to `run_main`,
which turns the failures a user can cause into one line on stderr and an exit code
(errors.py lists them): the same for every entry point.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

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
    print(f"{prog}: {line}", file=sys.stderr, flush=True)


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
