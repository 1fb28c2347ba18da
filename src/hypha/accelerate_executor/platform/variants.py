"""The executor's variants: one table that the shim, the launcher, `worker-config`, `doctor`,
`build` and the tests read. Torch-free and dependency-free: the launcher reads it in the
image, the shim on a host without torch.

Each row says which torch build a variant carries and where pip finds it, which accelerator
and runtime version it targets, the NVIDIA driver it needs, and its requirements file under
docker/requirements/ (the full pinned closure; tests/unit/platform/test_variant_pins.py proves each file
and its row agree, and that the torch build exists).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

Accelerator = Literal["cpu", "nvidia", "rocm", "mps"]
# Docker's names for the CPU architectures images are built for (linux/amd64, linux/arm64).
Arch = Literal["amd64", "arm64"]
ARCHES: tuple[Arch, ...] = ("amd64", "arm64")

TORCH_INDEX = "https://download.pytorch.org/whl"


@dataclass(frozen=True)
class DriverNeed:
    """The NVIDIA driver a CUDA build needs (NVIDIA's CUDA release notes): `native` runs
    it as built; from `compatible` on, a driver of the same CUDA major runs it through
    minor-version compatibility (no PTX JIT of newer code, which triton does not need:
    it ships its own ptxas)."""

    native: str
    compatible: str | None


# CUDA 12.x minor-version compatibility starts at driver 525.60.13.
CUDA12_COMPATIBLE = "525.60.13"


@dataclass(frozen=True)
class Variant:
    name: str
    accelerator: Accelerator
    torch: str  # the version torch is pinned to, without a local label
    local_label: str | None  # "+cu126" of 2.13.0+cu126; None: PyPI's own build
    index: str | None  # where pip finds that build; None: PyPI
    runtime: str | None  # CUDA or ROCm version the build targets
    driver: DriverNeed | None  # NVIDIA variants only
    requirements: str  # file under docker/requirements/
    container: bool = True  # False: a bundle the shim runs on the host
    arch: Arch = "amd64"  # the CPU architecture this row's build is for

    @property
    def torch_build(self) -> str:
        """The version `torch.__version__` reads in the image (PyPI's CUDA builds say
        their CUDA too, but their pin carries no label)."""
        return f"{self.torch}+{self.local_label}" if self.local_label else self.torch

    @property
    def torch_requirement(self) -> str:
        """The line the requirements file pins torch with. PyPI's own build is pinned with
        `===`, which a local build of the same version (`+cpu` in a find-links folder)
        cannot satisfy; `==2.13.0` would let it in and win as the higher version."""
        if self.local_label:
            return f"torch=={self.torch_build}"
        return f"torch==={self.torch}"

    @property
    def gpu(self) -> bool:
        return self.accelerator in ("nvidia", "rocm")

    def runtime_name(self) -> str:
        names = {"nvidia": "CUDA", "rocm": "ROCm"}
        if self.runtime and self.accelerator in names:
            return f"{names[self.accelerator]} {self.runtime}"
        return self.accelerator


VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="cpu",
        accelerator="cpu",
        torch="2.13.0",
        local_label="cpu",
        index=f"{TORCH_INDEX}/cpu",
        runtime=None,
        driver=None,
        requirements="cpu.txt",
    ),
    Variant(
        name="cu126",
        accelerator="nvidia",
        torch="2.13.0",
        local_label="cu126",
        index=f"{TORCH_INDEX}/cu126",
        runtime="12.6",
        driver=DriverNeed(native="560.28.03", compatible=CUDA12_COMPATIBLE),
        requirements="cu126.txt",
    ),
    Variant(
        name="cu128",
        accelerator="nvidia",
        torch="2.10.0",
        local_label=None,
        index=None,
        runtime="12.8",
        driver=DriverNeed(native="570.26", compatible=CUDA12_COMPATIBLE),
        requirements="cu128.txt",
    ),
    Variant(
        name="cu129",
        accelerator="nvidia",
        torch="2.8.0",
        local_label="cu129",
        index=f"{TORCH_INDEX}/cu129",
        runtime="12.9",
        driver=DriverNeed(native="575.51.03", compatible=CUDA12_COMPATIBLE),
        requirements="cu129.txt",
    ),
    Variant(
        name="cu130",
        accelerator="nvidia",
        torch="2.13.0",
        local_label=None,
        index=None,
        runtime="13.0",
        # 13.0 is the first CUDA 13: minor-version compatibility (from R580) adds nothing.
        driver=DriverNeed(native="580.65.06", compatible=None),
        requirements="cu130.txt",
    ),
    Variant(
        name="rocm64",
        accelerator="rocm",
        torch="2.9.0",
        local_label="rocm6.4",
        index=f"{TORCH_INDEX}/rocm6.4",
        runtime="6.4",
        driver=None,
        requirements="rocm64.txt",
    ),
    Variant(
        name="mps-host",
        accelerator="mps",
        torch="2.13.0",
        local_label=None,
        index=None,
        runtime=None,
        driver=None,
        requirements="mps.txt",
        container=False,
        arch="arm64",
    ),
)

# The arm64 builds (Graviton, Ampere, Grace Hopper/Blackwell, DGX Spark, Apple silicon's
# Docker), rows of their own where the wheels differ from x86_64's. PyPI's torch for
# manylinux_2_28_aarch64 is a CPU build up to 2.10.0 and the CUDA 13 build from then on
# (docker/torch-releases.toml, `aarch64`); the PyTorch index's +cpu wheels are x86_64's.
BY_NAME = {v.name: v for v in VARIANTS}
ARM64_VARIANTS: tuple[Variant, ...] = (
    replace(
        BY_NAME["cpu"], torch="2.10.0", local_label=None, index=None,
        requirements="cpu-arm64.txt", arch="arm64",
    ),
    replace(BY_NAME["cu130"], requirements="cu130-arm64.txt", arch="arm64"),
)  # fmt: skip
# Every container build: (variant, architecture) -> its row. BY_NAME's rows are amd64's.
BUILDS: dict[tuple[str, Arch], Variant] = {
    **{(v.name, v.arch): v for v in VARIANTS if v.container},
    **{(v.name, v.arch): v for v in ARM64_VARIANTS},
}
NAMES = tuple(BY_NAME)
CONTAINER_VARIANTS = tuple(v.name for v in VARIANTS if v.container)
HOST_VARIANT = next(v.name for v in VARIANTS if not v.container)
NVIDIA_VARIANTS = tuple(v.name for v in VARIANTS if v.accelerator == "nvidia")
GPU_VARIANTS = tuple(v.name for v in VARIANTS if v.gpu)
# What `worker-config --variant auto` prefers among the NVIDIA variants a driver runs (a
# native run before minor-version compatibility): cu130 has the newest torch and CUDA;
# cu128 is Hypha's own default install, with Blackwell kernels and torch 2.10; cu129 carries
# only torch 2.8 (the one torch with CUDA 12.9 builds); cu126 has no Blackwell kernels.
NVIDIA_PREFERENCE = ("cu130", "cu128", "cu129", "cu126")


def architectures(variant: str) -> tuple[Arch, ...]:
    """The architectures a container variant is built for, amd64 first."""
    return tuple(arch for arch in ARCHES if (variant, arch) in BUILDS)


def requirement_lines(path: Path) -> Iterator[str]:
    """The requirement lines of a pip requirements file, `-r` includes expanded."""
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            yield from requirement_lines(path.parent / line.split(None, 1)[1])
        elif line:
            yield line
