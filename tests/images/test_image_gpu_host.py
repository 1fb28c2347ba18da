"""The launcher in a container on a fake GPU host: a device node handed in as a worker's
`--gpus` would (`--device /dev/null:/dev/nvidia0`) and the host driver's version file given
through the test-only override. The cpu image stands in for a CUDA image (HYPHA_VARIANT set
to the CUDA variant; its torch is the CPU build, so CUDA is unusable in it as on a host whose
driver is missing). tests/images/test_image_cuda.py runs the same on the real CUDA images."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from image_harness import docker_run

pytestmark = pytest.mark.docker

DRIVER_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
)
DRIVER_550 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:23:56 UTC 2024\n"
)
JOB_ARGS = ("--socket", "/nowhere/bridge.sock", "--work-dir", "/nowhere", "--job", "{}")


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    """A folder the container's arbitrary uid can read, mounted at /host-driver."""
    path = Path(tempfile.mkdtemp(prefix="hy-driver-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def on_fake_gpu_host(
    image: str, variant: str, driver_dir: Path, driver: str | None, *args: str, gpu: bool = True
) -> tuple[int, list[str], list[str]]:
    if driver is not None:
        (driver_dir / "version").write_text(driver)
        (driver_dir / "version").chmod(0o644)
    options = [
        "--env", f"HYPHA_VARIANT={variant}",
        "--env", "HYPHA_NVIDIA_DRIVER_VERSION_FILE=/host-driver/version",
        "--volume", f"{driver_dir}:/host-driver:ro",
    ]  # fmt: skip
    if gpu:
        options += ["--device", "/dev/null:/dev/nvidia0"]
    result = docker_run(image, *args, options=options)
    return result.returncode, result.stdout.splitlines(), result.stderr.splitlines()


def test_driver_535_runs_cu128_through_minor_version_compatibility(
    cpu_image: str, driver_dir: Path
) -> None:
    code, out, err = on_fake_gpu_host(cpu_image, "cu128", driver_dir, DRIVER_535, *JOB_ARGS)
    assert out == [
        "launcher: NVIDIA driver 535.104.05 runs cu128 (CUDA 12.8) through minor-version "
        "compatibility (natively from 570.26) (from /host-driver/version)"
    ]
    # The driver would do, but this torch cannot use the GPU: no rank starts on the CPU.
    assert code == 2
    assert err == [
        "launcher: 1 GPU(s) were handed to the cu128 container but torch cannot use them "
        "(Torch not compiled with CUDA enabled); not training on the CPU instead"
    ]


def test_driver_550_refuses_cu130_and_names_cu128(cpu_image: str, driver_dir: Path) -> None:
    code, out, err = on_fake_gpu_host(cpu_image, "cu130", driver_dir, DRIVER_550, *JOB_ARGS)
    assert (code, out) == (2, [])
    assert err == [
        "launcher: NVIDIA driver 550.54.15 cannot run cu130 (CUDA 13.0), which needs "
        ">= 580.65.06; the variant for this host is cu128 (minor-version compatibility)"
    ]


def test_gpus_without_a_driver_file_are_refused(cpu_image: str, driver_dir: Path) -> None:
    code, out, err = on_fake_gpu_host(cpu_image, "cu130", driver_dir, None, *JOB_ARGS)
    assert (code, out) == (2, [])
    assert err == [
        "launcher: GPUs were handed to the container (/dev/nvidia0) but no NVIDIA driver "
        "version is readable (/host-driver/version: No such file or directory); the cu130 "
        "image (CUDA 13.0) needs a driver >= 580.65.06: give it the GPUs through the NVIDIA "
        "container toolkit (--gpus)"
    ]


def test_no_gpus_falls_back_to_the_cpu_with_a_warning(cpu_image: str, driver_dir: Path) -> None:
    code, out, err = on_fake_gpu_host(cpu_image, "cu130", driver_dir, None, *JOB_ARGS, gpu=False)
    # The warning comes before any rank; the rank then finds no bridge at /nowhere.
    assert out[0] == (
        "launcher: warning: the cu130 image sees no GPU, so it trains on the CPU "
        "(run the container with --gpus all for the GPU)"
    )
    assert code != 0 and not any("NVIDIA driver" in line for line in out + err)
