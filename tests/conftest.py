"""Fixtures shared by every test folder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A work base with a short path: a Unix socket path must fit in 107 bytes, and
    pytest's tmp_path with a long test name does not leave room for hypha-<uuid>/bridge.sock."""
    path = Path(tempfile.mkdtemp(prefix="hy-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
