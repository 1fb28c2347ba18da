"""Build-time checks of /opt/venv, run by the Dockerfile's deps stage.

Fails the build (one line on stderr, exit 1) when the venv would make the image lie:
a torch version other than the one its label states, CUDA libraries in the cpu image,
a GPU variant without DeepSpeed, rocm64 without its triton. Reads package metadata only: no torch import.

usage: python check_venv.py VARIANT TORCH_VERSION
TORCH_VERSION empty: the image states none (compose's builds), so there is none to check.
"""

import importlib.metadata as metadata
import sys
from pathlib import Path

# File name prefixes of CUDA runtime libraries; any of them in the cpu venv is a leak.
CUDA_LIBRARIES = ("libcudart", "libcublas", "libcudnn", "libnccl", "libcusparse", "libnvrtc")


def problems(variant: str, torch_version: str) -> list[str]:
    found: list[str] = []
    installed = metadata.version("torch")
    if torch_version and installed.split("+")[0] != torch_version:
        found.append(f"torch {installed} installed but TORCH_VERSION={torch_version}")
    names = {(dist.metadata["Name"] or "").lower() for dist in metadata.distributions()}
    if variant == "cpu":
        found += [
            f"cpu venv holds CUDA package {n}" for n in sorted(names) if n.startswith("nvidia-")
        ]
        venv = Path(sys.prefix)
        found += [
            f"cpu venv holds CUDA library {p.relative_to(venv)}"
            for p in venv.rglob("lib*.so*")
            if p.name.startswith(CUDA_LIBRARIES)
        ]
    elif "deepspeed" not in names:
        found.append(f"{variant} venv lacks deepspeed")
    if variant == "rocm64" and "pytorch-triton-rocm" not in names:
        found.append("rocm64 venv lacks pytorch-triton-rocm (the ROCm torch's triton)")
    return found


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: check_venv.py VARIANT TORCH_VERSION", file=sys.stderr)
        return 2
    found = problems(sys.argv[1], sys.argv[2])
    for line in found:
        print(f"check_venv: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
