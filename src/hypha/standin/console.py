"""Whole-line printing shared by the threads of one local-cluster process.

`print` writes the text and the newline separately, so lines from several workers'
threads can interleave mid-line; one locked write per line cannot.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

_lock = threading.Lock()


def say(prefix: str, text: str, stream: TextIO | None = None) -> None:
    """Writes `[prefix] text` as one flushed line (stdout unless `stream` is given)."""
    out = stream or sys.stdout
    with _lock:
        out.write(f"[{prefix}] {text}\n")
        out.flush()


def warn(prefix: str, text: str) -> None:
    say(prefix, text, sys.stderr)
