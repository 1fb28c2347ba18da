"""entry.exit_without_teardown: the code it is given, and every line written before it, even
those still in a buffer (Python's own, or the C library's), reach the parent."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LEAVE = """
import ctypes, logging, sys
from hypha.accelerate_executor.entry import exit_without_teardown
logging.basicConfig(stream=sys.stderr, format="%(message)s")
sys.stdout.write("buffered stdout, no newline")
sys.stderr.write("buffered stderr, no newline")
logging.getLogger("job").warning("a logging line")
ctypes.CDLL(None).printf(b"a C stdio line, in a pipe's buffer\\n")
exit_without_teardown(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 1, 2, 143])
def test_the_code_and_every_buffered_line_come_out(code: int) -> None:
    # stdout is a pipe: Python and the C library both buffer it whole until a flush.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", LEAVE, str(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == code
    assert "buffered stdout, no newline" in done.stdout
    assert "a C stdio line, in a pipe's buffer" in done.stdout
    assert "buffered stderr, no newline" in done.stderr
    assert "a logging line" in done.stderr
