"""What `selftest` reads of the host: its accelerators, the driver's verdict, and the peak
arithmetic rate an MFU figure is measured against."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hypha.accelerate_executor.platform.gpus import describe, read_driver, verdict
from hypha.accelerate_executor.platform.variants import BY_NAME, VARIANTS


@dataclass(frozen=True)
class Device:
    """One accelerator as torch sees it (the CPU is the device of a host without one)."""

    index: int
    name: str
    memory_bytes: int | None  # None: the CPU's, not stated
    capability: tuple[int, int] | None  # CUDA compute capability; None off NVIDIA
    bf16: bool
    tf32: bool


@dataclass(frozen=True)
class Host:
    backend: str  # "cuda", "rocm", "mps" or "cpu": what the devices are driven by
    torch_version: str
    runtime: str  # "CUDA 13.0", "ROCm 6.4", "Metal", "-"
    devices: tuple[Device, ...]
    driver_line: str  # the driver verdict in words
    driver_runs: bool | None  # False: this build cannot run on this driver; None: not asked

    @property
    def gpus(self) -> int:
        return 0 if self.backend == "cpu" else len(self.devices)


def probe_host(env: Mapping[str, str] = os.environ) -> Host:
    """The accelerators torch can use here, and whether the host's driver runs its build."""
    import torch

    version = str(torch.__version__)
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        rocm = torch.version.hip is not None
        devices = []
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            capability = None if rocm else (properties.major, properties.minor)
            devices.append(
                Device(
                    index,
                    properties.name,
                    int(properties.total_memory),
                    capability,
                    bf16=bool(torch.cuda.is_bf16_supported()),
                    # TF32 tensor cores arrived with Ampere (8.0); ROCm has none.
                    tf32=capability is not None and capability >= (8, 0),
                )
            )
        if rocm:
            return Host(
                "rocm", version, f"ROCm {torch.version.hip}", tuple(devices),
                "ROCm: no driver version check (the kernel driver serves every ROCm 6 build)",
                None,
            )  # fmt: skip
        line, runs = nvidia_driver_verdict(str(torch.version.cuda), env)
        return Host("cuda", version, f"CUDA {torch.version.cuda}", tuple(devices), line, runs)
    if torch.backends.mps.is_available():
        mps = Device(0, "Apple silicon GPU (MPS)", None, None, bf16=True, tf32=False)
        return Host("mps", version, "Metal", (mps,), "Metal: no driver check", None)
    cpu = Device(0, cpu_name(), None, None, bf16=True, tf32=False)
    return Host("cpu", version, "-", (cpu,), "no GPU visible: the CPU trains", None)


def nvidia_driver_verdict(cuda: str, env: Mapping[str, str]) -> tuple[str, bool | None]:
    """The launcher's driver verdict for this CUDA build: for the image's variant
    (HYPHA_VARIANT), or natively for the variant built for the same CUDA."""
    name = env.get("HYPHA_VARIANT")
    if name not in BY_NAME:
        name = next(
            (v.name for v in VARIANTS if v.accelerator == "nvidia" and v.runtime == cuda), None
        )
    driver = read_driver(env)
    if name is None or BY_NAME[name].driver is None:
        where = f" (from {driver.source})" if driver.version else ""
        return (
            f"NVIDIA driver {driver.version or 'unknown'}{where}; torch built for CUDA {cuda}",
            None,
        )
    if driver.version is None:
        return f"no NVIDIA driver version readable ({driver.source})", False
    found = verdict(BY_NAME[name], driver.version)
    return f"{describe(found)} (from {driver.source})", found.runs


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU ({os.cpu_count()} cores)"


# Dense (no sparsity) peak rates per device, in TFLOP/s, from NVIDIA's data sheets: (name
# pattern, bf16 tensor cores, plain fp32). The first pattern matching torch's name wins.
PEAK_TFLOPS: tuple[tuple[str, float, float], ...] = (
    (r"H100.*PCIe", 756.0, 51.2),
    (r"GH200|H100|H200|H800", 989.4, 66.9),  # SXM and Grace Hopper
    (r"A100|A800", 312.0, 19.5),
    (r"L40S", 362.1, 91.6),
    (r"\bL4\b", 121.0, 30.3),
)


def peak_tflops(device_name: str, mixed_precision: str) -> float | None:
    """The device's peak for the precision the matrix products run in: bf16 under bf16
    autocast, else fp32 (torch leaves TF32 off for fp32 products unless told)."""
    for pattern, bf16, fp32 in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return bf16 if mixed_precision == "bf16" else fp32
    return None
