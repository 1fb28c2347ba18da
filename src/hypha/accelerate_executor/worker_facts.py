"""Two facts of a Hypha worker's host: where the shim's console script is, and how long the
path of a job's bridge socket may be."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# sun_path holds 108 bytes with its NUL; the worker's socket is BASE/hypha-<uuid>/bridge.sock.
MAX_SOCKET_PATH_BYTES = 107
SOCKET_SUFFIX_BYTES = len("/hypha-00000000-0000-0000-0000-000000000000/bridge.sock")


def console_script() -> str:
    """`hypha-accelerate` beside this interpreter (the same installation, even in a venv that
    is not activated), else the one on PATH, else the bare name."""
    beside = Path(sys.executable).parent / "hypha-accelerate"
    if beside.is_file():
        return str(beside)
    return shutil.which("hypha-accelerate") or "hypha-accelerate"
