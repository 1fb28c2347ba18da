"""Fixtures shared by every test folder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def docker_api() -> Any:
    """The real Docker engine. No engine fails the tests that need one: the test command
    provides it, and a silently skipped container test proves nothing."""
    import docker

    try:
        api = docker.APIClient(version="auto")
        api.ping()
    except Exception as exc:
        pytest.fail(f"no Docker engine ({exc}); deselect these tests with -m 'not docker'")
    return api


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A work base with a short path: a Unix socket path must fit in 107 bytes, and
    pytest's tmp_path with a long test name does not leave room for hypha-<uuid>/bridge.sock."""
    path = Path(tempfile.mkdtemp(prefix="hy-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
