"""A GPU host told the truth, without a GPU: the driver's version read from the texts real
drivers write (and from broken ones), the verdict table of driver x variant, and the
launcher's answer before any rank starts, on a fake /dev and a driver-version file given
through the test-only overrides."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hypha.accelerate_executor.platform.gpus import (
    DEV_OVERRIDE,
    DRIVER_FILE_OVERRIDE,
    best_nvidia,
    describe,
    parse_driver_version,
    read_driver,
    verdict,
)
from hypha.accelerate_executor.platform.variants import BY_NAME, NVIDIA_VARIANTS
from repo_paths import REPO

ROOT = REPO

# /proc/driver/nvidia/version as the proprietary and the open kernel modules write it.
PROPRIETARY_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
OPEN_570 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:51:19 UTC 2025\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
OPEN_AARCH64_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build  "
    "(dvs-builder@U22-I3-AE18-23-3)  Sun Jul 27 06:54:38 UTC 2025\n"
)
PROPRIETARY_550 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (PROPRIETARY_535, "535.104.05"),
        (OPEN_570, "570.86.15"),
        (OPEN_AARCH64_580, "580.65.06"),
        (PROPRIETARY_550, "550.54.15"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.26  Fri Jan 10 UTC 2025\n", "570.26"),
        # Malformed: no version, a truncated file, another file's text, an empty file.
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module\n", None),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  5", None),
        ("GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", None),
        ("", None),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.abc.05  ...\n", None),
    ],
)
def test_driver_version_read_from_real_and_broken_texts(text: str, version: str | None) -> None:
    assert parse_driver_version(text) == version


def test_a_missing_or_malformed_driver_file_gives_no_version_and_says_why(tmp_path: Path) -> None:
    missing = read_driver({DRIVER_FILE_OVERRIDE: str(tmp_path / "version")})
    assert missing.version is None
    assert missing.source == f"{tmp_path}/version: No such file or directory"
    (tmp_path / "garbled").write_text("not a driver\n")
    garbled = read_driver({DRIVER_FILE_OVERRIDE: str(tmp_path / "garbled")})
    assert (garbled.version, garbled.source) == (
        None,
        f"{tmp_path}/garbled names no driver version",
    )
    (tmp_path / "good").write_text(OPEN_570)
    assert read_driver({DRIVER_FILE_OVERRIDE: str(tmp_path / "good")}).version == "570.86.15"


NATIVE, COMPAT, NO = "native", "minor-version compatibility", None


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        # driver:       cu126   cu128   cu129   cu130
        ("470.256.02", (NO, NO, NO, NO)),
        ("525.60.12", (NO, NO, NO, NO)),
        ("525.60.13", (COMPAT, COMPAT, COMPAT, NO)),
        ("535.104.05", (COMPAT, COMPAT, COMPAT, NO)),
        ("550.54.15", (COMPAT, COMPAT, COMPAT, NO)),
        ("560.28.03", (NATIVE, COMPAT, COMPAT, NO)),
        ("570.26", (NATIVE, NATIVE, COMPAT, NO)),
        ("570.86.15", (NATIVE, NATIVE, COMPAT, NO)),
        ("575.51.03", (NATIVE, NATIVE, NATIVE, NO)),
        ("580.65.06", (NATIVE, NATIVE, NATIVE, NATIVE)),
        ("590.44.01", (NATIVE, NATIVE, NATIVE, NATIVE)),
        (None, (NO, NO, NO, NO)),
    ],
)
def test_verdict_table(driver: str | None, expected: tuple[str | None, ...]) -> None:
    assert NVIDIA_VARIANTS == ("cu126", "cu128", "cu129", "cu130")
    assert tuple(verdict(BY_NAME[v], driver).mode for v in NVIDIA_VARIANTS) == expected


@pytest.mark.parametrize(
    ("driver", "best"),
    [
        ("535.104.05", ("cu128", COMPAT)),
        ("550.54.15", ("cu128", COMPAT)),
        ("560.35.03", ("cu126", NATIVE)),  # native beats compatibility
        ("570.124.06", ("cu128", NATIVE)),
        ("575.57.08", ("cu128", NATIVE)),  # cu129 runs too, but carries torch 2.8
        ("580.82.07", ("cu130", NATIVE)),
    ],
)
def test_the_best_variant_for_a_driver(driver: str, best: tuple[str, str]) -> None:
    found = best_nvidia(driver)
    assert found is not None and (found.variant.name, found.mode) == best


def test_no_variant_for_a_driver_older_than_cuda_12() -> None:
    assert best_nvidia("470.256.02") is None
    assert describe(verdict(BY_NAME["cu128"], "470.256.02")) == (
        "NVIDIA driver 470.256.02 cannot run cu128 (CUDA 12.8), which needs >= 570.26 "
        "(>= 525.60.13 through minor-version compatibility); no variant runs on it "
        "(the oldest need: >= 525.60.13)"
    )


# The launcher, as the image runs it, on a fake host: a /dev with an nvidia0 node and a
# driver-version file, through the test-only overrides.


def launcher(
    tmp_path: Path, variant: str, driver_text: str | None, gpus: int = 1, *args: str
) -> subprocess.CompletedProcess[str]:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for index in range(gpus):
        (dev / f"nvidia{index}").touch()
    (dev / "nvidiactl").touch()  # not a GPU
    driver_file = tmp_path / "version"
    if driver_text is not None:
        driver_file.write_text(driver_text)
    env = {
        **os.environ,
        "HYPHA_VARIANT": variant,
        "HYPHA_ACCELERATE_CONFIGS": str(ROOT / "accelerate-configs"),
        DEV_OVERRIDE: str(dev),
        DRIVER_FILE_OVERRIDE: str(driver_file),
    }
    return subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.platform.launcher", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


JOB_ARGS = ("--socket", "/nonexistent/bridge.sock", "--work-dir", "/nonexistent", "--job", "{}")


def test_driver_535_runs_cu128_through_minor_version_compatibility(tmp_path: Path) -> None:
    shown = launcher(tmp_path, "cu128", PROPRIETARY_535, 1, "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == (
        "launcher: NVIDIA driver 535.104.05 runs cu128 (CUDA 12.8) through minor-version "
        f"compatibility (natively from 570.26) (from {tmp_path}/version)"
    )
    assert "accelerate config: " in shown.stdout and "gpu.yaml (auto: variant cu128, 1 GPU" in (
        shown.stdout
    )


def test_driver_550_refuses_cu130_and_names_cu128(tmp_path: Path) -> None:
    refused = launcher(tmp_path, "cu130", PROPRIETARY_550, 2, *JOB_ARGS)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "launcher: NVIDIA driver 550.54.15 cannot run cu130 (CUDA 13.0), which needs >= 580.65.06; "
        "the variant for this host is cu128 (minor-version compatibility)"
    ]


@pytest.mark.parametrize("driver_text", [None, "", "GCC version: 12\n"])
def test_gpus_without_a_readable_driver_are_refused(
    tmp_path: Path, driver_text: str | None
) -> None:
    refused = launcher(tmp_path, "cu128", driver_text, 1, *JOB_ARGS)
    assert refused.returncode == 2
    why = (
        f"{tmp_path}/version: No such file or directory"
        if driver_text is None
        else f"{tmp_path}/version names no driver version"
    )
    assert refused.stderr.splitlines() == [
        f"launcher: GPUs were handed to the container ({tmp_path}/dev/nvidia0) but no NVIDIA "
        f"driver version is readable ({why}); the cu128 image (CUDA 12.8) needs a driver "
        ">= 570.26 (>= 525.60.13 through minor-version compatibility): give it the GPUs "
        "through the NVIDIA container toolkit (--gpus)"
    ]


def test_gpus_that_torch_cannot_use_end_the_launch_instead_of_training_on_the_cpu(
    tmp_path: Path,
) -> None:
    # The driver would do, but no GPU is there: the CPU build of torch says it has no CUDA,
    # a CUDA build (the torch matrix's) that it finds no driver. Either is torch's own word.
    refused = launcher(tmp_path, "cu128", OPEN_570, 1, *JOB_ARGS)
    assert refused.returncode == 2
    assert refused.stdout.splitlines() == [
        f"launcher: NVIDIA driver 570.86.15 runs cu128 (CUDA 12.8) natively (from {tmp_path}/version)"
    ]
    [line] = refused.stderr.splitlines()
    assert re.fullmatch(
        r"launcher: 1 GPU\(s\) were handed to the cu128 container but torch cannot use them "
        r"\((Torch not compiled with CUDA enabled|Found no NVIDIA driver on your system\..*)\); "
        r"not training on the CPU instead",
        line,
    ), line


def test_no_gpus_trains_on_the_cpu_with_a_warning_and_reads_no_driver(tmp_path: Path) -> None:
    shown = launcher(tmp_path, "cu130", None, 0, "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert "launcher: NVIDIA driver" not in shown.stdout
    assert "cpu.yaml (auto: the cu130 image sees no GPU, so it trains on the CPU" in shown.stdout
