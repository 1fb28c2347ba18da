"""The executor's variants and the image tags each one is built and run under."""

from __future__ import annotations

from hypha.accelerate_executor import __version__

IMAGE_REPOSITORY = "hypha-accelerate-executor"
CONTAINER_VARIANTS = ("cpu", "cu126", "cu129", "cu130", "rocm64")
# Docker on macOS cannot reach Metal, so this variant is a bundle the shim runs on the host.
HOST_VARIANT = "mps-host"
VARIANTS = (*CONTAINER_VARIANTS, HOST_VARIANT)
NVIDIA_VARIANTS = ("cu126", "cu129", "cu130")
GPU_VARIANTS = (*NVIDIA_VARIANTS, "rocm64")


def image_tags(variant: str) -> tuple[str, str]:
    """The tag this shim's release matches first, then the moving per-variant tag."""
    return f"{IMAGE_REPOSITORY}:{__version__}-{variant}", f"{IMAGE_REPOSITORY}:{variant}"


def build_command(variant: str) -> str:
    return f"hypha-accelerate build {variant}"
