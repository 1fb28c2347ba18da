"""Each variant's pinned requirements, read as pip reads them. The torch builds of cu126,
cu129 and rocm64 cannot be fetched here, so for them these files are all there is to check;
what the built images do is tested on the images: test_image_cpu.py, test_image_cu130.py
(PyPI's CUDA build, marked cuda_image) and test_image_standin_gpu.py (the cu126 stage graph
with a stand-in torch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hypha.accelerate_executor.shim import build
from hypha.accelerate_executor.shim.variants import CONTAINER_VARIANTS, GPU_VARIANTS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
REQUIREMENTS = ROOT / "docker" / "requirements"
# The torch build each variant must install; cu130's is PyPI's own, which has no local label.
TORCH_BUILDS = {
    "cpu": "2.13.0+cpu",
    "cu126": "2.13.0+cu126",
    "cu129": "2.13.0+cu129",
    "cu130": "2.13.0",
    "rocm64": "2.13.0+rocm6.4",
}


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
    pinned = {name: pinned_version(r) for name, r in requirements(f"{variant}.txt").items()}
    assert pinned["torch"] == TORCH_BUILDS[variant]
    assert build.torch_pin(ROOT, f"{variant}.txt") == "2.13.0"
    common = {name: pinned_version(r) for name, r in requirements("common.txt").items()}
    assert common.items() <= pinned.items()
    # Jobs with an `image` preprocessor (upstream's default job) need PIL.
    assert "pillow" in common


def test_cu130_takes_only_pypis_build_of_torch() -> None:
    # A local 2.13.0+cpu (this machine's find-links, the PyTorch CPU index) satisfies
    # `==2.13.0` and would win as the higher version; the pin must refuse it.
    torch = requirements("cu130.txt")["torch"]
    assert torch.specifier.contains("2.13.0")
    assert not torch.specifier.contains("2.13.0+cpu")
    assert not torch.specifier.contains("2.13.0+cu130")


@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_gpu_variants_carry_deepspeed(variant: str) -> None:
    assert requirements(f"{variant}.txt")["deepspeed"] == requirements("deepspeed.txt")["deepspeed"]


def test_cpu_carries_no_gpu_package() -> None:
    names = set(requirements("cpu.txt"))
    assert not {"deepspeed", "triton"} & names
    assert not any(name.startswith(("nvidia-", "cuda-")) for name in names)


def test_the_mps_bundle_pins_pypis_macos_torch_and_the_common_closure() -> None:
    pinned = requirements("mps.txt")
    assert pinned_version(pinned["torch"]) == "2.13.0"
    assert requirements("common.txt").items() <= pinned.items()


def test_the_standin_is_labelled_as_one_and_differs_only_in_torch() -> None:
    text = (REQUIREMENTS / "ci-standin-cu126.txt").read_text()
    assert text.startswith("# STAND-IN, NOT A RELEASE REQUIREMENTS SET.")
    standin, real = requirements("ci-standin-cu126.txt"), requirements("cu126.txt")
    assert standin.keys() == real.keys()
    assert all(standin[name] == real[name] for name in real if name != "torch")
    assert pinned_version(standin["torch"]) == "2.13.0+cpu"
