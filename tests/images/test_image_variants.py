"""Each variant's pinned requirements, read as pip reads them. The torch builds of cu126,
cu129 and rocm64 cannot be fetched here, so for them these files are all there is to check
(tests/unit/platform/test_variant_pins.py proves each pin names a wheel that exists); what the built
images do is tested on the images: test_image_cpu.py, test_image_cuda.py (cu128 and cu130,
PyPI's CUDA builds, marked cuda_image) and test_image_standin_gpu.py (the cu126 stage graph
with a stand-in torch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hypha.accelerate_executor.platform.image_tags import CONTAINER_VARIANTS, GPU_VARIANTS
from hypha.accelerate_executor.platform.variants import BY_NAME
from hypha.accelerate_executor.tools.builder import command as build

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
REQUIREMENTS = ROOT / "docker" / "requirements"


def requirements(name: str) -> dict[str, Requirement]:
    return {
        (req := Requirement(line)).name: req
        for line in build.requirement_lines(REQUIREMENTS / name)
    }


def pinned_version(requirement: Requirement) -> str:
    (specifier,) = requirement.specifier
    assert specifier.operator in ("==", "==="), f"{requirement} is not an exact pin"
    return specifier.version


def test_every_build_arg_is_documented_in_the_header() -> None:
    header = DOCKERFILE.split("\nARG ", 1)[0]
    for name in set(re.findall(r"^ARG (\w+)", DOCKERFILE, re.MULTILINE)):
        assert name in header, f"build arg {name} is not documented at the top"


@pytest.mark.parametrize("variant", CONTAINER_VARIANTS)
def test_variant_pins_its_torch_build_over_the_common_closure(variant: str) -> None:
    row = BY_NAME[variant]
    pinned = {name: pinned_version(r) for name, r in requirements(row.requirements).items()}
    assert pinned["torch"] == row.torch_build
    assert build.torch_pin(ROOT, row.requirements) == row.torch
    common = {name: pinned_version(r) for name, r in requirements("common.txt").items()}
    assert common.items() <= pinned.items()
    # Jobs with an `image` preprocessor (upstream's default job) need PIL.
    assert "pillow" in common


@pytest.mark.parametrize(("variant", "version"), [("cu128", "2.10.0"), ("cu130", "2.13.0")])
def test_pypi_cuda_variants_take_only_pypis_build_of_torch(variant: str, version: str) -> None:
    # A local X+cpu (this machine's find-links, the PyTorch CPU index) satisfies `==X` and
    # would win as the higher version; the pin must refuse it.
    torch = requirements(f"{variant}.txt")["torch"]
    assert torch.specifier.contains(version)
    assert not torch.specifier.contains(f"{version}+cpu")
    assert not torch.specifier.contains(f"{version}+{variant}")


@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_gpu_variants_carry_deepspeed(variant: str) -> None:
    assert requirements(f"{variant}.txt")["deepspeed"] == requirements("deepspeed.txt")["deepspeed"]


def test_cpu_carries_no_gpu_package() -> None:
    names = set(requirements("cpu.txt"))
    assert not {"deepspeed", "triton"} & names
    assert not any(name.startswith(("nvidia-", "cuda-")) for name in names)


def test_the_mps_bundle_pins_pypis_macos_torch_and_the_common_closure() -> None:
    pinned = requirements("mps.txt")
    assert pinned_version(pinned["torch"]) == BY_NAME["mps-host"].torch
    assert requirements("common.txt").items() <= pinned.items()


def test_the_standin_is_labelled_as_one_and_differs_only_in_torch() -> None:
    text = (REQUIREMENTS / "ci-standin-cu126.txt").read_text()
    assert text.startswith("# STAND-IN, NOT A RELEASE REQUIREMENTS SET.")
    standin, real = requirements("ci-standin-cu126.txt"), requirements("cu126.txt")
    assert standin.keys() == real.keys()
    assert all(standin[name] == real[name] for name in real if name != "torch")
    assert pinned_version(standin["torch"]) == "2.13.0+cpu"


def test_the_nvidia_variants_and_only_they_get_the_compile_toolchain() -> None:
    """The runtime stage installs gcc (and Python's headers) for torch.compile where the
    variant's name matches its `case` pattern: every NVIDIA container variant, nothing else."""
    step = DOCKERFILE.split("# torch.compile on a GPU", 1)[1].split("COPY --from=venv", 1)[0]
    (pattern,) = re.findall(r'case "\$VARIANT" in (\S+)\)', step)
    assert pattern == "cu*"
    for variant in CONTAINER_VARIANTS:
        nvidia = BY_NAME[variant].accelerator == "nvidia"
        assert variant.startswith("cu") == nvidia, variant
    assert "gcc" in step and "python3-dev" in step and "rm -rf /var/lib/apt/lists/*" in step
