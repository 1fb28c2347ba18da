"""`hypha-accelerate doctor`: a verdict table, exit 0 exactly when the cpu path works."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.platform.image_tags import CONTAINER_VARIANTS
from shim_harness import WORKER_GID, WORKER_UID, shim_command


def doctor(
    *args: str, env: dict[str, str] | None = None, **popen: Any
) -> tuple[int, dict[str, tuple[str, str]]]:
    result = subprocess.run(
        shim_command("doctor", *args),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
        **popen,
    )
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("hypha-accelerate doctor ")
    assert lines[-1].startswith("verdict: ")
    body = lines[1:-1]
    if result.returncode == 0:  # a working cpu path: the selftest to run next
        assert body.pop().startswith("next: train on this host's accelerators and measure it: ")
    rows = {}
    for line in body:
        name, status, detail = _row(line)
        rows[name] = (status, detail)
    return result.returncode, rows


def _row(line: str) -> tuple[str, str, str]:
    name, rest = line.strip().split("  ", 1)
    status, _, detail = rest.strip().partition("  ")
    return name, status.strip(), detail.strip()


@pytest.mark.docker
def test_the_cpu_image_runs_and_the_verdict_is_ok(cpu_image: str, work_base: Path) -> None:
    base = work_base / "doctor"  # short: the bridge socket path must fit
    base.mkdir()
    code, rows = doctor("--work-dir-base", str(base), "--image", cpu_image)
    assert code == 0
    assert rows["docker engine"][0] == "ok"
    assert rows["work dir base"][0] == "ok"
    assert {name for name in rows if name.startswith("image ")} == {
        f"image {v}" for v in CONTAINER_VARIANTS
    }
    assert rows["image cpu"][0] == "ok" and rows["image cpu"][1].startswith(f"{cpu_image} (")
    assert rows["cpu run"][0] == "ok"
    assert rows["cpu run"][1].startswith(f"hypha-accelerate-executor {__version__} (cpu) in ")
    assert list(base.iterdir()) == []  # the smoke run's work dir is gone


@pytest.mark.docker
def test_a_missing_cpu_image_fails_the_verdict(docker_api: Any, work_base: Path) -> None:
    absent = f"hypha-accelerate-executor:absent-{uuid.uuid4().hex}"
    code, rows = doctor("--work-dir-base", str(work_base), "--image", absent)
    assert code == 1
    assert rows["image cpu"] == ("missing", "build it with `hypha-accelerate build cpu`")
    assert rows["cpu run"][0] == "skipped"


def test_docker_unreachable_and_bad_base() -> None:
    code, rows = doctor(
        "--work-dir-base", "/nonexistent/base", env={"DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    assert code == 1
    assert rows["docker engine"][0] == "FAIL" and "cannot reach" in rows["docker engine"][1]
    assert rows["work dir base"] == ("FAIL", "/nonexistent/base: No such file or directory")
    assert rows["cpu run"][0] == "skipped"


def test_base_too_long_for_the_bridge_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    _, rows = doctor("--work-dir-base", str(deep), env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert rows["work dir base"][0] == "FAIL" and "over 107" in rows["work dir base"][1]


def test_base_the_worker_cannot_write(work_base: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run as another user")
    base = work_base / "roots"
    base.mkdir(mode=0o755)
    _, rows = doctor(
        "--work-dir-base",
        str(base),
        env={"DOCKER_HOST": "unix:///nonexistent.sock"},
        user=WORKER_UID,
        group=WORKER_GID,
    )
    assert rows["work dir base"][0] == "FAIL"
    assert f"{WORKER_UID}:{WORKER_GID} cannot create work dirs" in rows["work dir base"][1]


def test_the_host_rows_on_a_fake_gpu_host(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for index in range(2):
        (dev / f"nvidia{index}").touch()
    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:23:56 UTC 2024\n"
    )
    code, rows = doctor(
        "--work-dir-base",
        str(tmp_path),
        env={
            "DOCKER_HOST": "unix:///nonexistent.sock",
            "HYPHA_HOST_DEV": str(dev),
            "HYPHA_NVIDIA_DRIVER_VERSION_FILE": str(version),
        },
    )
    assert code == 1  # no engine, so no cpu run
    assert rows["nvidia driver"] == (
        "ok",
        f"550.54.15 (from {version}); 2 GPU(s): {dev}/nvidia0, {dev}/nvidia1",
    )
    assert rows["runs cpu"] == ("ok", "on the CPU")
    assert rows["runs cu126"] == (
        "ok",
        "through minor-version compatibility (driver 550.54.15; natively from 560.28.03)",
    )
    assert rows["runs cu128"][0] == rows["runs cu129"][0] == "ok"
    assert rows["runs cu130"] == ("no", "needs a driver >= 580.65.06; this host has 550.54.15")
    assert rows["runs rocm64"][0] == "no"
    assert rows["best variant"] == (
        "ok",
        "cu128: 2 NVIDIA GPU(s); NVIDIA driver 550.54.15 runs cu128 (CUDA 12.8) through "
        "minor-version compatibility (natively from 570.26)",
    )


def test_gpus_without_a_driver_version_fail_the_driver_row(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").touch()
    _, rows = doctor(
        "--work-dir-base",
        str(tmp_path),
        env={
            "DOCKER_HOST": "unix:///nonexistent.sock",
            "HYPHA_HOST_DEV": str(dev),
            "HYPHA_NVIDIA_DRIVER_VERSION_FILE": str(tmp_path / "absent"),
        },
    )
    assert rows["nvidia driver"] == (
        "FAIL",
        f"1 GPU(s): {dev}/nvidia0, but no driver version ({tmp_path}/absent: No such file or directory)",
    )
    assert all(rows[f"runs {v}"][0] == "no" for v in ("cu126", "cu128", "cu129", "cu130"))
    assert rows["best variant"][1].startswith(
        "cpu: 1 NVIDIA GPU(s), but no driver version readable"
    )


def test_doctor_points_to_the_selftest_that_fits_the_host() -> None:
    from hypha.accelerate_executor.tools.doctor import Check, selftest_command

    cpu = Check("image cpu", "ok", "hypha-accelerate-executor:cpu (1.1 GB)")
    cu130 = Check("image cu130", "ok", "hypha-accelerate-executor:cu130 (6.2 GB)")
    runtime = Check("nvidia runtime", "ok", "cu126/cu128/cu129/cu130 containers can get GPUs")
    driver = Check("nvidia driver", "ok", "580.159.04 (from /proc/driver/nvidia/version)")
    assert selftest_command([cpu, cu130, runtime, driver]) == (
        "docker run --rm --gpus all hypha-accelerate-executor:cu130 selftest"
    )
    # Without the runtime, or without a GPU image, the GPUs cannot be proven: the cpu path.
    missing = Check("nvidia runtime", "missing", "install nvidia-container-toolkit")
    for checks in ([cpu, cu130, missing, driver], [cpu, runtime, driver]):
        assert selftest_command(checks) == "docker run --rm hypha-accelerate-executor:cpu selftest"
    rocm = Check("rocm devices", "ok", "/dev/kfd, /dev/dri; groups video")
    image = Check("image rocm64", "ok", "hypha-accelerate-executor:rocm64 (9 GB)")
    assert selftest_command([cpu, image, rocm]) == (
        "docker run --rm --device /dev/kfd --device /dev/dri "
        "hypha-accelerate-executor:rocm64 selftest"
    )
