"""What a GPU host offers, read without torch: NVIDIA device nodes and the driver's version,
ROCm's device nodes, and per variant whether (and how) that driver runs it.

The launcher asks this inside a container (the NVIDIA container toolkit mounts the host's
/proc/driver/nvidia and libnvidia-ml), `doctor` and `worker-config --variant auto` on the
host. Two variables stand in for the host in tests, never in production:
HYPHA_NVIDIA_DRIVER_VERSION_FILE (a file read instead of /proc/driver/nvidia/version, and
no NVML fallback) and HYPHA_HOST_DEV (a folder read instead of /dev).
"""

from __future__ import annotations

import ctypes
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hypha.accelerate_executor.platform.variants import BY_NAME, NVIDIA_PREFERENCE, Variant

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
DRIVER_FILE_OVERRIDE = "HYPHA_NVIDIA_DRIVER_VERSION_FILE"
DEV_OVERRIDE = "HYPHA_HOST_DEV"
NVML_LIBRARY = "libnvidia-ml.so.1"

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (...)"
_NVRM = re.compile(
    r"^NVRM version:.*\bKernel Module(?: for \w+)?\s+(\d{3,4}\.\d{1,3}(?:\.\d{1,3})?)(?:\s|$)",
    re.MULTILINE,
)

Mode = Literal["native", "minor-version compatibility"]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def parse_driver_version(text: str) -> str | None:
    """The driver version a /proc/driver/nvidia/version text states; None when it states none."""
    found = _NVRM.search(text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Driver:
    """The host's NVIDIA driver version (None: unknown) and where it was read, or why not."""

    version: str | None
    source: str


def dev_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get(DEV_OVERRIDE) or "/dev")


def nvidia_nodes(dev: Path) -> list[Path]:
    return sorted(p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))


def rocm_nodes_present(dev: Path) -> bool:
    return (dev / "kfd").exists() and (dev / "dri").exists()


def _nvml_driver_version() -> str | None:
    try:
        nvml = ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        buffer = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(len(buffer))) != 0:
            return None
        return buffer.value.decode("ascii", "replace") or None
    finally:
        nvml.nvmlShutdown()


def read_driver(env: Mapping[str, str]) -> Driver:
    """The driver version from /proc/driver/nvidia/version, else from NVML."""
    given = env.get(DRIVER_FILE_OVERRIDE)
    path = Path(given) if given else DRIVER_VERSION_FILE
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        why = f"{path}: {exc.strerror or exc}"
    else:
        version = parse_driver_version(text)
        if version:
            return Driver(version, str(path))
        why = f"{path} names no driver version"
    if not given:
        version = _nvml_driver_version()
        if version and re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
            return Driver(version, "NVML")
        why += f", and {NVML_LIBRARY} gives none"
    return Driver(None, why)


@dataclass(frozen=True)
class Verdict:
    """Whether one NVIDIA variant runs on a driver, and how."""

    variant: Variant
    driver: str | None
    mode: Mode | None  # None: it does not run

    @property
    def runs(self) -> bool:
        return self.mode is not None

    def needs(self) -> str:
        need = self.variant.driver
        assert need is not None, f"{self.variant.name} is not an NVIDIA variant"
        text = f">= {need.native}"
        if need.compatible:
            text += f" (>= {need.compatible} through minor-version compatibility)"
        return text


def verdict(variant: Variant, driver: str | None) -> Verdict:
    need = variant.driver
    if need is None:
        raise ValueError(f"{variant.name} needs no NVIDIA driver")
    mode: Mode | None = None
    if driver is not None:
        if version_key(driver) >= version_key(need.native):
            mode = "native"
        elif need.compatible and version_key(driver) >= version_key(need.compatible):
            mode = "minor-version compatibility"
    return Verdict(variant, driver, mode)


def best_nvidia(driver: str | None) -> Verdict | None:
    """The NVIDIA variant this driver runs best: native before minor-version compatibility,
    then in NVIDIA_PREFERENCE's order. None when it runs none."""
    verdicts = [verdict(BY_NAME[name], driver) for name in NVIDIA_PREFERENCE]
    for mode in ("native", "minor-version compatibility"):
        for v in verdicts:
            if v.mode == mode:
                return v
    return None


def describe(v: Verdict) -> str:
    """One line: the driver, the variant, and whether and how one runs the other."""
    name = f"{v.variant.name} ({v.variant.runtime_name()})"
    if v.mode == "native":
        return f"NVIDIA driver {v.driver} runs {name} natively"
    if v.mode is not None:
        return (
            f"NVIDIA driver {v.driver} runs {name} through minor-version compatibility "
            f"(natively from {v.variant.driver.native if v.variant.driver else '?'})"
        )
    best = best_nvidia(v.driver)
    instead = (
        f"the variant for this host is {best.variant.name} ({best.mode})"
        if best
        else f"no variant runs on it (the oldest need: {_oldest_need()})"
    )
    return f"NVIDIA driver {v.driver} cannot run {name}, which needs {v.needs()}; {instead}"


def _oldest_need() -> str:
    needs = [
        n.compatible or n.native
        for name in NVIDIA_PREFERENCE
        if (n := BY_NAME[name].driver) is not None
    ]
    return ">= " + min(needs, key=version_key)


@dataclass(frozen=True)
class Host:
    """What this host offers the variants."""

    nvidia: tuple[Path, ...]  # GPU device nodes
    driver: Driver | None  # read only when there are NVIDIA GPUs
    rocm: bool  # /dev/kfd and /dev/dri
    apple_silicon: bool


def read_host(env: Mapping[str, str]) -> Host:
    dev = dev_dir(env)
    nodes = tuple(nvidia_nodes(dev))
    return Host(
        nvidia=nodes,
        driver=read_driver(env) if nodes else None,
        rocm=rocm_nodes_present(dev),
        apple_silicon=sys.platform == "darwin" and platform.machine() == "arm64",
    )


def can_run(host: Host, v: Variant) -> tuple[bool, str]:
    """Whether this host runs the variant on its accelerator, and how (or why not)."""
    if v.accelerator == "cpu":
        return True, "on the CPU"
    if v.accelerator == "rocm":
        if host.rocm:
            return True, "ROCm devices /dev/kfd and /dev/dri present"
        return False, "no /dev/kfd and /dev/dri (AMD GPU kernel driver)"
    if v.accelerator == "mps":
        return host.apple_silicon, "Metal on Apple silicon" if host.apple_silicon else (
            "macOS on Apple silicon only"
        )
    if not host.nvidia or host.driver is None:
        return False, "no NVIDIA GPU (no /dev/nvidia<N>)"
    if host.driver.version is None:
        return False, f"NVIDIA GPUs, but no driver version readable ({host.driver.source})"
    found = verdict(v, host.driver.version)
    if found.mode == "native":
        return True, f"natively (driver {found.driver})"
    if found.mode is not None:
        return True, (
            f"through minor-version compatibility (driver {found.driver}; "
            f"natively from {v.driver.native if v.driver else '?'})"
        )
    return False, f"needs a driver {found.needs()}; this host has {found.driver}"


def pick_variant(host: Host) -> tuple[str, str]:
    """The variant this host runs best, and why, in words for a comment."""
    if host.nvidia and host.driver is not None:
        gpus = f"{len(host.nvidia)} NVIDIA GPU(s)"
        if host.driver.version is None:
            return "cpu", f"{gpus}, but no driver version readable ({host.driver.source})"
        best = best_nvidia(host.driver.version)
        if best is None:
            return "cpu", (
                f"{gpus}, but driver {host.driver.version} runs no CUDA variant "
                f"(the oldest need: {_oldest_need()})"
            )
        return best.variant.name, f"{gpus}; {describe(best)}"
    if host.rocm:
        return "rocm64", "ROCm devices /dev/kfd and /dev/dri present"
    if host.apple_silicon:
        return "mps-host", "macOS on Apple silicon: Metal, through the host bundle"
    return "cpu", "no GPU on this host (no /dev/nvidia<N>, no /dev/kfd)"
