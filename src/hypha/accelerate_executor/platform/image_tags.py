"""The image tags each variant is built and run under; the variants themselves are the
table in hypha.accelerate_executor.platform.variants."""

from __future__ import annotations

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.platform.arch import host_arch
from hypha.accelerate_executor.platform.variants import (
    CONTAINER_VARIANTS,
    GPU_VARIANTS,
    HOST_VARIANT,
    NAMES,
    NVIDIA_VARIANTS,
    Arch,
)

__all__ = [
    "CONTAINER_VARIANTS",
    "GPU_VARIANTS",
    "HOST_VARIANT",
    "IMAGE_REPOSITORY",
    "NVIDIA_VARIANTS",
    "VARIANTS",
    "build_command",
    "image_tags",
]

IMAGE_REPOSITORY = "hypha-accelerate-executor"
VARIANTS = NAMES


def image_tags(variant: str, arch: Arch | None = None) -> tuple[str, str]:
    """The tag this shim's release matches first, then the moving per-variant tag. An image
    built for another architecture than this host's says so in its tags (cpu-arm64), so
    that both can sit on one engine and the plain tag is always the one this host runs."""
    name = variant if arch in (None, host_arch()) else f"{variant}-{arch}"
    return f"{IMAGE_REPOSITORY}:{__version__}-{name}", f"{IMAGE_REPOSITORY}:{name}"


def build_command(variant: str) -> str:
    return f"hypha-accelerate build {variant}"
