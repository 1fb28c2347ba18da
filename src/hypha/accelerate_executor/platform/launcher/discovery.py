"""Which GPUs this process may use, counted from /dev and the *_VISIBLE_DEVICES variables
(no torch), and which variant the image is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hypha.accelerate_executor.errors import LaunchError
from hypha.accelerate_executor.platform.gpus import nvidia_nodes
from hypha.accelerate_executor.platform.variants import BY_NAME, NAMES, VARIANTS

AMD_VENDOR_ID = "0x1002"


def image_variant(env: Mapping[str, str], dev: Path = Path("/dev")) -> str:
    """The variant baked into the image; outside one (a source checkout), the kind of GPU
    present stands for it."""
    variant = env.get("HYPHA_VARIANT")
    if variant is None:
        present = "rocm" if (dev / "kfd").exists() else "nvidia" if nvidia_nodes(dev) else "cpu"
        return next(v.name for v in VARIANTS if v.accelerator == present)
    if variant not in NAMES:
        raise LaunchError(f"HYPHA_VARIANT={variant!r} is not one of {', '.join(NAMES)}")
    return variant


def _visible_limit(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    """How many devices the first set *_VISIBLE_DEVICES variable admits (None: unset)."""
    for name in names:
        value = env.get(name)
        if value is not None:
            entries = [e for e in value.split(",") if e.strip()]
            # CUDA treats an invalid entry as the end of the list; -1 is the usual "none".
            return 0 if not entries or entries[0].strip() == "-1" else len(entries)
    return None


def count_gpus(
    variant: str, env: Mapping[str, str], dev: Path = Path("/dev"), sys_root: Path = Path("/sys")
) -> int:
    """GPUs this process may use. The NVIDIA runtime and `--device` put only the granted
    devices into the container's /dev, so the nodes there are the truth; the visibility
    variables can narrow them further."""
    accelerator = BY_NAME[variant].accelerator
    if accelerator == "nvidia":
        found = len(nvidia_nodes(dev))
        limit = _visible_limit(env, ("CUDA_VISIBLE_DEVICES",))
    elif accelerator == "rocm":
        if not (dev / "kfd").exists():
            return 0
        # Render nodes of other vendors (an integrated GPU, say) may sit beside AMD's.
        found = sum(
            1
            for node in (dev / "dri").glob("renderD*")
            if _read(sys_root / "class" / "drm" / node.name / "device" / "vendor") == AMD_VENDOR_ID
        )
        limit = _visible_limit(
            env, ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
        )
    elif accelerator == "mps":
        return 1
    else:
        return 0
    return found if limit is None else min(found, limit)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def gpu_image_without_gpus(variant: str, gpus: int) -> bool:
    return BY_NAME[variant].gpu and gpus == 0
