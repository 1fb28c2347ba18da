"""The one exception the host shim reports: a single line for stderr and an exit code."""

from __future__ import annotations

import argparse
from typing import NoReturn

# Exit codes, mirroring `docker run`, so that the shim and the worker's plain docker entry
# fail the same way: 2 the caller's arguments or job are wrong, 125 Docker could not run the
# container (engine, image, GPU runtime); anything else is the executor's own exit code.
EXIT_USAGE = 2
EXIT_DOCKER = 125


class ShimError(Exception):
    """A failure a user can cause, carried to `main` as one line and an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose complaints are one line (its own are usage plus a line)."""

    def error(self, message: str) -> NoReturn:
        raise ShimError(f"{message} (see --help)", EXIT_USAGE)
