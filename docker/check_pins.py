#!/usr/bin/env python3
"""Prove, offline, that every torch pin under docker/requirements/ names a wheel that exists,
and that the variants table (src/hypha/accelerate_executor/platform/variants.py) says what the files say.

A pin exists when docker/torch-releases.toml (PyPI's and PyTorch's release matrix) lists its
version, its local label (+cpu, +cuNNN, +rocmX.Y) among that release's builds, and the images'
Python (cp311) among its wheels. An arm64 row pins PyPI's own aarch64 wheel, which the matrix
says is a CPU or a CUDA build, and its file is NAME-arm64.txt (its wheelhouse is downloaded for
aarch64 by that name). PyPI's own build (no label) must be pinned with `===`:
`==X` also admits a local X+cpu, which pip prefers. A +rocm build needs the
pytorch-triton-rocm that its release pins.

usage: python docker/check_pins.py [--requirements DIR] [--matrix FILE]
Prints one line per problem and exits 1, or one summary line and exits 0. Stdlib only.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The variants table and its requirements reader, from the checkout's source (stdlib only).
sys.path.insert(0, str(HERE.parent / "src"))
from hypha.accelerate_executor.platform.variants import (  # noqa: E402
    ARM64_VARIANTS,
    VARIANTS,
    requirement_lines,
)

PYTHON_TAG = "cp311"  # the images' interpreter: python:3.11-slim-bookworm, Debian 12's 3.11
TORCH_LINE = re.compile(r"torch\s*(?P<op>===|==)\s*(?P<version>[0-9][0-9.]*)(?:\+(?P<label>\S+))?")
INDEX_LINE = re.compile(r"^#\s*torch-index:\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Pin:
    file: str
    operator: str
    version: str
    label: str | None

    def __str__(self) -> str:
        return f"torch{self.operator}{self.version}" + (f"+{self.label}" if self.label else "")


def pins(path: Path) -> dict[str, str]:
    """name -> the whole requirement line, for every line of the file and its includes."""
    found: dict[str, str] = {}
    for line in requirement_lines(path):
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if name:
            found[name.group(0).lower().replace("_", "-")] = line
    return found


def torch_pin(path: Path) -> Pin | str | None:
    """The file's torch pin; a string says why its torch line is no exact pin; None: no torch."""
    line = pins(path).get("torch")
    if line is None:
        return None
    parsed = TORCH_LINE.fullmatch(line.replace(" ", ""))
    if not parsed:
        return f"{path.name}: `{line}` is not an exact pin (torch==X+label or torch===X)"
    return Pin(path.name, parsed["op"], parsed["version"], parsed["label"])


def cuda_of(label: str) -> str | None:
    """cu129 -> 12.9, cu118 -> 11.8; None for a label that is no CUDA one."""
    found = re.fullmatch(r"cu(\d{2})(\d)", label)
    return f"{int(found[1])}.{found[2]}" if found else None


def python_key(tag: str) -> tuple[int, int]:
    return int(tag[2]), int(tag[3:])


def pin_problems(pin: Pin, triton_rocm: str | None, matrix: dict[str, Any]) -> list[str]:
    where = f"{pin.file}: {pin}"
    minor = ".".join(pin.version.split(".")[:2])
    release = matrix["releases"].get(minor)
    if release is None or pin.version not in release["versions"]:
        return [f"{where}: torch {pin.version} is no release the matrix lists"]
    problems = []
    low, high = release["python"]
    if not python_key(low) <= python_key(PYTHON_TAG) <= python_key(high):
        problems.append(f"{where}: torch {minor} has no {PYTHON_TAG} wheels ({low} to {high})")
    label = pin.label
    if label is None:
        if pin.operator != "===":
            problems.append(
                f"{where}: `==` also admits a local {pin.version}+cpu, which pip prefers; "
                f"pin PyPI's own build with torch==={pin.version}"
            )
    elif label == "cpu":
        pass
    elif (cuda := cuda_of(label)) is not None:
        if cuda not in release["cuda"]:
            problems.append(
                f"{where}: no CUDA {cuda} build of torch {minor} exists "
                f"(CUDA builds: {', '.join(release['cuda'])})"
            )
    elif label.startswith("rocm"):
        rocm = label.removeprefix("rocm")
        if rocm not in release["rocm"]:
            problems.append(
                f"{where}: no ROCm {rocm} build of torch {minor} exists "
                f"(ROCm builds: {', '.join(release['rocm'])})"
            )
            return problems
        wanted = release.get("triton", {}).get(pin.version)
        if wanted is None:
            problems.append(f"{where}: the matrix names no triton for torch {pin.version}")
        elif triton_rocm != f"pytorch-triton-rocm=={wanted}":
            problems.append(
                f"{where}: a ROCm torch needs pytorch-triton-rocm=={wanted}, "
                f"the file has {triton_rocm or 'none'}"
            )
    else:
        problems.append(f"{where}: unknown local label +{label}")
    return problems


def file_problems(path: Path, matrix: dict[str, Any]) -> list[str]:
    pin = torch_pin(path)
    if pin is None:
        return []
    if isinstance(pin, str):
        return [pin]
    return pin_problems(pin, pins(path).get("pytorch-triton-rocm"), matrix)


def table_problems(variants: Sequence[Any], directory: Path, matrix: dict[str, Any]) -> list[str]:
    """Every row of the variants table against its requirements file and the matrix."""
    problems = []
    for v in variants:
        path = directory / v.requirements
        where = f"variant {v.name} ({v.requirements})"
        if not path.is_file():
            problems.append(f"{where}: no such file")
            continue
        pin = torch_pin(path)
        if not isinstance(pin, Pin) or str(pin) != v.torch_requirement:
            problems.append(f"{where}: the table pins {v.torch_requirement}, the file {pin}")
            continue
        indexes = INDEX_LINE.findall(path.read_text())
        if indexes != ([v.index] if v.index else []):
            problems.append(f"{where}: the table's index is {v.index}, the file's {indexes}")
        release = matrix["releases"].get(".".join(v.torch.split(".")[:2]), {})
        if v.arch == "arm64" and v.container:
            problems += arm64_problems(v, where, release)
        elif v.accelerator == "nvidia":
            cuda = cuda_of(v.local_label) if v.local_label else release.get("pypi_cuda")
            if cuda != v.runtime:
                problems.append(f"{where}: the table says CUDA {v.runtime}, the build is {cuda}")
            if v.driver is None:
                problems.append(f"{where}: an NVIDIA variant without its driver needs")
        elif v.accelerator == "rocm" and v.local_label != f"rocm{v.runtime}":
            problems.append(f"{where}: the table says ROCm {v.runtime}, the build +{v.local_label}")
        elif v.accelerator == "cpu" and v.local_label != "cpu":
            problems.append(f"{where}: a cpu variant must pin the +cpu build")
    return problems


def arm64_problems(v: Any, where: str, release: dict[str, Any]) -> list[str]:
    """An arm64 row against what PyPI's aarch64 wheel of its torch is."""
    if v.requirements != f"{v.name}-arm64.txt":
        # The Dockerfile picks VARIANT-ARCH.txt by that name when nobody names the file.
        return [f"{where}: an arm64 row's file is named NAME-arm64.txt"]
    if v.local_label:
        return [f"{where}: an arm64 row pins PyPI's own aarch64 build, not +{v.local_label}"]
    build = release.get("aarch64")
    if build is None:
        return [f"{where}: the matrix lists no aarch64 build of torch {v.torch}"]
    wanted = "cpu" if v.accelerator == "cpu" else v.runtime
    if build != wanted:
        return [
            f"{where}: PyPI's aarch64 torch {v.torch} is a {build} build, the row wants {wanted}"
        ]
    if v.accelerator == "nvidia" and v.driver is None:
        return [f"{where}: an NVIDIA variant without its driver needs"]
    return []


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="check_pins.py", description=__doc__.splitlines()[0])
    p.add_argument("--requirements", type=Path, default=HERE / "requirements", metavar="DIR")
    p.add_argument("--matrix", type=Path, default=HERE / "torch-releases.toml", metavar="FILE")
    p.add_argument("--no-table", action="store_true", help="check the files only")
    args = p.parse_args(argv)
    matrix = tomllib.loads(args.matrix.read_text())
    files = sorted(args.requirements.glob("*.txt"))
    problems = [line for path in files for line in file_problems(path, matrix)]
    if not args.no_table:
        problems += table_problems([*VARIANTS, *ARM64_VARIANTS], args.requirements, matrix)
    for line in problems:
        print(f"check_pins: {line}", file=sys.stderr)
    if problems:
        return 1
    pinned = [f"{path.name} {pin}" for path in files if isinstance(pin := torch_pin(path), Pin)]
    print(f"check_pins: {len(pinned)} torch pins exist: {'; '.join(pinned)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
