"""Fixtures for the image tests: the real Docker engine and the cpu image (tests/conftest.py),
and a work base for jobs in containers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def work_base() -> Iterator[Path]:
    # Short (the socket path must fit 107 bytes) and traversable by the worker's uid.
    base = Path(f"/tmp/hypha-img-{os.getpid()}")
    base.mkdir(mode=0o755)
    yield base
    for leftover in base.iterdir():
        pytest.fail(f"work dir left behind: {leftover}")
    base.rmdir()
