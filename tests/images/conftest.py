"""Fixtures for the image tests: the real Docker engine and the cpu image, built offline
once per session when the current version's image is missing (tests/run.sh builds it
first, so normally this only reuses it)."""

from __future__ import annotations

from typing import Any

import pytest
from image_harness import CPU_IMAGE, hypha_accelerate, image_exists


@pytest.fixture(scope="session")
def cpu_image(docker_api: Any) -> str:
    if not image_exists(docker_api, CPU_IMAGE):
        built = hypha_accelerate("build", "cpu", "--offline")
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    return CPU_IMAGE
