"""Fixtures for the shim's and the tools' tests (a pytest plugin, tests/conftest.py): the real Docker engine, a stand-in executor image, a
job's work dir as the worker makes it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim_harness import MissingBaseImage, WorkerJob, ensure_test_image, new_worker_job


@pytest.fixture(scope="session")
def fake_image(docker_api: Any) -> str:
    """The stand-in executor image, built when missing. Its base comes only from an offline
    build (the test command makes it first); without it these tests fail, since a skipped
    container test proves nothing."""
    try:
        return ensure_test_image(docker_api)
    except MissingBaseImage as exc:
        pytest.fail(f"base image missing: {exc}; deselect these tests with -m 'not docker'")


@pytest.fixture(scope="session")
def work_base() -> Iterator[Path]:
    """Like the worker's work_dir_base: every uid may traverse it."""
    base = Path(f"/tmp/hypha-shim-tests-{os.getpid()}")
    base.mkdir()
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def worker_job(work_base: Path) -> Iterator[WorkerJob]:
    job = new_worker_job(work_base)
    yield job
    for process in job.processes:
        if process.poll() is None:
            process.kill()
            process.wait()
    job.bridge_away()
    shutil.rmtree(job.work_dir, ignore_errors=True)
