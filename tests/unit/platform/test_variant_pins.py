"""docker/check_pins.py, the offline proof that every torch pin names a wheel that exists and
that the variants table says what the requirements files say: run on the repository's files
(CI runs this test), and shown to refuse the pins that do not exist."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hypha.accelerate_executor.platform.variants import ARM64_VARIANTS, BUILDS, BY_NAME, VARIANTS
from repo_paths import REPO

ROOT = REPO
SCRIPT = ROOT / "docker" / "check_pins.py"
REQUIREMENTS = ROOT / "docker" / "requirements"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_pins", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_pins = load_script()
MATRIX: dict[str, Any] = tomllib.loads((ROOT / "docker" / "torch-releases.toml").read_text())


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def problems_of(tmp_path: Path, *lines: str) -> list[str]:
    path = tmp_path / "variant.txt"
    path.write_text("\n".join(lines) + "\n")
    return list(check_pins.file_problems(path, MATRIX))


def test_every_requirements_file_pins_a_torch_that_exists_and_the_table_agrees() -> None:
    result = run_script()
    assert result.returncode == 0, result.stderr
    # Every variant's file was checked, not only some, both architectures'.
    for v in (*VARIANTS, *ARM64_VARIANTS):
        assert f"{v.requirements} {v.torch_requirement}" in result.stdout


@pytest.mark.parametrize(
    ("pin", "why"),
    [
        ("torch==2.13.0+cu129", "no CUDA 12.9 build of torch 2.13 exists"),
        ("torch==2.13.0+rocm6.4", "no ROCm 6.4 build of torch 2.13 exists"),
        ("torch==2.10.0+rocm6.4", "no ROCm 6.4 build of torch 2.10 exists"),
        ("torch==2.9.0+cu129", "no CUDA 12.9 build of torch 2.9 exists"),
        ("torch==2.8.5+cu129", "torch 2.8.5 is no release the matrix lists"),
        ("torch==2.13.0", "`==` also admits a local 2.13.0+cpu"),
        ("torch>=2.8", "is not an exact pin"),
        ("torch==2.13.0+xpu", "unknown local label +xpu"),
    ],
)
def test_pins_that_name_no_wheel_are_refused(tmp_path: Path, pin: str, why: str) -> None:
    (problem,) = problems_of(tmp_path, pin)
    assert why in problem


def test_the_script_refuses_a_file_with_a_missing_build_and_says_which(tmp_path: Path) -> None:
    (tmp_path / "common.txt").write_text("numpy==2.4.6\n")
    (tmp_path / "cu129.txt").write_text("-r common.txt\ntorch==2.13.0+cu129\n")
    result = run_script("--requirements", str(tmp_path), "--no-table")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "check_pins: cu129.txt: torch==2.13.0+cu129: no CUDA 12.9 build of torch 2.13 exists "
        "(CUDA builds: 12.6, 13.0, 13.2)"
    ]


def test_a_rocm_build_needs_the_triton_its_release_pins(tmp_path: Path) -> None:
    assert problems_of(tmp_path, "torch==2.9.0+rocm6.4", "pytorch-triton-rocm==3.5.0") == []
    (missing,) = problems_of(tmp_path, "torch==2.9.0+rocm6.4")
    assert "needs pytorch-triton-rocm==3.5.0, the file has none" in missing
    (wrong,) = problems_of(tmp_path, "torch==2.9.0+rocm6.4", "pytorch-triton-rocm==3.4.0")
    assert "the file has pytorch-triton-rocm==3.4.0" in wrong


def test_builds_the_matrix_lists_pass(tmp_path: Path) -> None:
    for pin in ("torch==2.8.0+cu129", "torch===2.10.0", "torch==2.13.0+cu126", "torch==2.7.1+cpu"):
        assert problems_of(tmp_path, pin) == [], pin


def test_a_release_without_wheels_for_the_images_python_is_refused(tmp_path: Path) -> None:
    matrix = {"releases": {"2.8": {**MATRIX["releases"]["2.8"], "python": ["cp312", "cp313"]}}}
    pin = check_pins.Pin("x.txt", "==", "2.8.0", "cu129")
    (problem,) = check_pins.pin_problems(pin, None, matrix)
    assert "torch 2.8 has no cp311 wheels (cp312 to cp313)" in problem


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"torch": "2.9.0"}, "the table pins torch===2.9.0, the file torch===2.10.0"),
        ({"index": "https://download.pytorch.org/whl/cu128"}, "the table's index is"),
        ({"runtime": "12.9"}, "the table says CUDA 12.9, the build is 12.8"),
        ({"driver": None}, "an NVIDIA variant without its driver needs"),
        ({"requirements": "cu127.txt"}, "no such file"),
    ],
)
def test_a_table_row_that_disagrees_with_its_file_is_refused(
    change: dict[str, Any], why: str
) -> None:
    assert check_pins.table_problems(VARIANTS, REQUIREMENTS, MATRIX) == []
    row = dataclasses.replace(BY_NAME["cu128"], **change)
    (problem,) = check_pins.table_problems([row], REQUIREMENTS, MATRIX)
    assert why in problem


def test_the_table_names_the_builds_the_issue_settled() -> None:
    builds = {v.name: v.torch_build for v in VARIANTS}
    assert builds == {
        "cpu": "2.13.0+cpu",
        "cu126": "2.13.0+cu126",
        "cu128": "2.10.0",
        "cu129": "2.8.0+cu129",
        "cu130": "2.13.0",
        "rocm64": "2.9.0+rocm6.4",
        "mps-host": "2.13.0",
    }


def test_the_arm64_rows_are_the_builds_pypi_has_for_aarch64() -> None:
    builds = {name: v.torch_build for (name, arch), v in BUILDS.items() if arch == "arm64"}
    assert builds == {"cpu": "2.10.0", "cu130": "2.13.0"}
    assert check_pins.table_problems(ARM64_VARIANTS, REQUIREMENTS, MATRIX) == []


@pytest.mark.parametrize(
    ("row", "change", "why"),
    [
        # 2.13.0's aarch64 wheel needs the CUDA 13 wheels: no CPU image could carry it.
        (
            "cpu",
            {"torch": "2.13.0"},
            "PyPI's aarch64 torch 2.13.0 is a 13.0 build, the row wants cpu",
        ),
        (
            "cu130",
            {"torch": "2.10.0"},
            "PyPI's aarch64 torch 2.10.0 is a cpu build, the row wants 13.0",
        ),
        ("cpu", {"torch": "2.9.0"}, "the matrix lists no aarch64 build of torch 2.9.0"),
        ("cpu", {"local_label": "cpu"}, "pins PyPI's own aarch64 build, not +cpu"),
        ("cpu", {"requirements": "cpu.txt"}, "an arm64 row's file is named NAME-arm64.txt"),
        ("cu130", {"driver": None}, "an NVIDIA variant without its driver needs"),
    ],
)
def test_an_arm64_row_without_that_aarch64_build_is_refused(
    row: str, change: dict[str, Any], why: str
) -> None:
    changed = dataclasses.replace(BUILDS[(row, "arm64")], **change)
    (problem,) = check_pins.arm64_problems(
        changed, row, MATRIX["releases"].get(changed.torch.rsplit(".", 1)[0], {})
    )
    assert why in problem
