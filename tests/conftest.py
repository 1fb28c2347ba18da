"""Fixtures shared by every test folder. The folders follow the code: unit/ by package (in
this process), system/ (executors as processes against the stand-in), images/, shim/ and
tools/ (a real Docker engine), bench/ (the benchmarks' smoke tests); helpers/ holds what
they share, and no test module imports another."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.platform.image_tags import image_tags

# Fixtures more than one test folder uses, from the helpers (tests/helpers/, on pytest's path).
pytest_plugins = ["standin_fixtures", "shim_fixtures"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI (CI=true) a skipped test fails the run: a test that silently did not run
    proves nothing, and CI's machine has everything the suite needs."""
    if not os.environ.get("CI") or exitstatus != pytest.ExitCode.OK:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        print(f"\nCI: {len(skipped)} test(s) skipped; in CI every test must run", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="session")
def cpu_image(docker_api: Any) -> str:
    """The cpu image of this version, built offline once when missing (tests/run.sh builds
    it first, so normally this only finds it)."""
    from docker.errors import ImageNotFound

    tag = image_tags("cpu")[0]
    try:
        docker_api.inspect_image(tag)
    except ImageNotFound:
        built = subprocess.run(
            [sys.executable, "-m", "hypha.accelerate_executor.cli", "build", "cpu", "--offline"],
            capture_output=True, text=True, timeout=1800, cwd=REPO,
        )  # fmt: skip
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    return tag


@pytest.fixture(scope="session")
def assets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder for the stand-in's embedded model and data set, made once per
    session with the default job's assets (the causal-LM's) in it; the assets of another
    spec are generated into it by whoever asks for them (ensure_assets)."""
    from hypha.standin.data_service.assets import ensure_assets

    path = tmp_path_factory.mktemp("assets")
    ensure_assets(path)
    return path


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A work base with a short path: a Unix socket path must fit in 107 bytes, and
    pytest's tmp_path with a long test name does not leave room for hypha-<uuid>/bridge.sock."""
    path = Path(tempfile.mkdtemp(prefix="hy-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
