"""The image tags each variant is built and run under; the variants themselves are the
table in hypha.accelerate_executor.variants."""

from __future__ import annotations

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.variants import (
    CONTAINER_VARIANTS,
    GPU_VARIANTS,
    HOST_VARIANT,
    NAMES,
    NVIDIA_VARIANTS,
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


def image_tags(variant: str) -> tuple[str, str]:
    """The tag this shim's release matches first, then the moving per-variant tag."""
    return f"{IMAGE_REPOSITORY}:{__version__}-{variant}", f"{IMAGE_REPOSITORY}:{variant}"


def build_command(variant: str) -> str:
    return f"hypha-accelerate build {variant}"
