"""The CUDA images built for real from PyPI's own torch: cu128 (torch 2.10.0, CUDA 12.8, the
build Hypha installs by default on Linux) and cu130 (torch 2.13.0, CUDA 13.0), each with its
CUDA runtime wheels and DeepSpeed, offline from a wheelhouse made on the host. No GPU here,
so CUDA cannot run, but its libraries must load, the image must train on the CPU when it gets
no GPU, and on a fake GPU host (a device node, a driver-version file) it must say how the
driver runs it, or refuse, and never train on the CPU.

Marked `cuda_image` and left out of the default run (pyproject's addopts say
`-m "not cuda_image"`), so `bash .ci/run` does not run it: on a fresh CI machine each
image's wheelhouse is a 2.6-4 GB download, and wheelhouse and build add about seven minutes
and some 17 GB of disk per image to a run that has 90 minutes and a disk shared with every
other image. Run it with `pytest -m cuda_image tests/images/test_image_cuda.py` (add
`-k cu128` for one image); it builds each image when missing.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.platform.image_tags import image_tags
from hypha.accelerate_executor.platform.variants import BY_NAME
from hypha.standin.coordinator.server import RunOptions
from image_harness import (
    CUDA_LIBRARIES,
    check_cuda_libraries,
    docker_entry,
    docker_run,
    ensure_image,
    run_job,
)

pytestmark = [pytest.mark.docker, pytest.mark.cuda_image]

DRIVER_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
)
JOB_ARGS = ("--socket", "/nowhere/bridge.sock", "--work-dir", "/nowhere", "--job", "{}")


@pytest.fixture(scope="module", params=sorted(CUDA_LIBRARIES))
def cuda_image(request: pytest.FixtureRequest, docker_api: Any) -> tuple[str, str]:
    variant: str = request.param
    return variant, ensure_image(docker_api, image_tags(variant)[0], variant, "--offline")


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hy-driver-", dir="/tmp"))
    path.chmod(0o755)
    (path / "version").write_text(DRIVER_535)
    (path / "version").chmod(0o644)
    yield path
    shutil.rmtree(path)


def test_labels_name_the_variant_and_torch(docker_api: Any, cuda_image: tuple[str, str]) -> None:
    variant, tag = cuda_image
    labels = docker_api.inspect_image(tag)["Config"]["Labels"]
    assert labels["io.hypha.accelerate-executor.variant"] == variant
    assert labels["io.hypha.accelerate-executor.torch-version"] == BY_NAME[variant].torch


def test_cuda_cudnn_and_nccl_load_without_a_gpu_and_deepspeed_imports(
    cuda_image: tuple[str, str],
) -> None:
    variant, tag = cuda_image
    check_cuda_libraries(tag, variant)


def test_auto_picks_the_cpu_config_when_no_gpu_is_visible(cuda_image: tuple[str, str]) -> None:
    variant, tag = cuda_image
    result = docker_run(tag, "--print-config")
    assert result.returncode == 0, result.stderr
    assert f"/opt/hypha/accelerate-configs/cpu.yaml (auto: the {variant} image sees no GPU" in (
        result.stdout
    )


def test_a_gpu_handed_in_without_a_usable_cuda_is_refused_not_trained_on_the_cpu(
    cuda_image: tuple[str, str], driver_dir: Path
) -> None:
    variant, tag = cuda_image
    result = docker_run(
        tag,
        *JOB_ARGS,
        options=(
            "--device", "/dev/null:/dev/nvidia0",
            "--env", "HYPHA_NVIDIA_DRIVER_VERSION_FILE=/host-driver/version",
            "--volume", f"{driver_dir}:/host-driver:ro",
        ),
    )  # fmt: skip
    assert result.returncode == 2
    if variant == "cu130":
        assert result.stdout == ""
        assert result.stderr.splitlines() == [
            "launcher: NVIDIA driver 535.104.05 cannot run cu130 (CUDA 13.0), which needs "
            ">= 580.65.06; the variant for this host is cu128 (minor-version compatibility)"
        ]
        return
    assert result.stdout.splitlines() == [
        "launcher: NVIDIA driver 535.104.05 runs cu128 (CUDA 12.8) through minor-version "
        "compatibility (natively from 570.26) (from /host-driver/version)"
    ]
    # A real CUDA torch, a device node with no driver behind it: torch says so, in one line.
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "launcher: 1 GPU(s) were handed to the cu128 container but torch cannot use them ("
    )
    assert line.endswith("); not training on the CPU instead")


@pytest.mark.slow
def test_two_round_diloco_job_on_the_cpu_in_the_container(
    cuda_image: tuple[str, str], work_base: Path
) -> None:
    record = run_job(
        docker_entry(cuda_image[1]),
        work_base,
        RunOptions(workers=1, rounds=2, steps_per_round=4, generation="alpha17"),
    )
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert sorted(record["metrics"]) == [1, 2]
    assert record["leaks"] == []
