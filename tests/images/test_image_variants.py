"""What can be checked of every variant without its torch build: the Dockerfile's stage
graph and build args, and each variant's pinned requirements (the GPU torch wheels cannot
be fetched here; test_image_standin_gpu.py builds the cu126 graph with a stand-in)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypha.accelerate_executor.shim import build
from hypha.accelerate_executor.shim.variants import CONTAINER_VARIANTS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
REQUIREMENTS = ROOT / "docker" / "requirements"
TORCH_BUILDS = {"cpu": "cpu", "cu126": "cu126", "cu129": "cu129", "rocm64": "rocm6.4"}


def pins(name: str) -> dict[str, str]:
    lines = build.requirement_lines(REQUIREMENTS / name)
    return dict(line.split("==", 1) for line in lines)


def test_stages_read_top_to_bottom_on_one_base() -> None:
    stages = re.findall(r"^FROM (\S+) AS ([\w-]+)$", DOCKERFILE, re.MULTILINE)
    assert stages == [
        ("${BASE_IMAGE}", "wheel"),
        ("${BASE_IMAGE}", "venv"),
        ("${BASE_IMAGE}", "runtime"),
        # The local cluster's image, on top of the executor's, for compose.yaml.
        ("venv", "cluster-packages"),
        ("runtime", "cluster"),
    ]
    runtime = DOCKERFILE.split("AS runtime", 1)[1].split("\nFROM ", 1)[0]
    assert set(re.findall(r"COPY --from=(\w+)", runtime)) == {"wheel", "venv"}
    assert runtime.rstrip().endswith('CMD ["--help"]')
    assert (
        'ENTRYPOINT ["/opt/venv/bin/python", "-m", "hypha.accelerate_executor.launcher"]' in runtime
    )


def test_every_build_arg_is_documented_in_the_header() -> None:
    header = DOCKERFILE.split("\nARG ", 1)[0]
    for name in set(re.findall(r"^ARG (\w+)", DOCKERFILE, re.MULTILINE)):
        assert name in header, f"build arg {name} is not documented at the top"
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in DOCKERFILE


def test_online_torch_index_defaults_to_the_variants_pytorch_index() -> None:
    assert 'case "$VARIANT" in rocm64) index=rocm6.4 ;; *) index=$VARIANT ;; esac' in DOCKERFILE
    assert "https://download.pytorch.org/whl/$index" in DOCKERFILE


@pytest.mark.parametrize("variant", CONTAINER_VARIANTS)
def test_variant_pins_its_torch_build_and_the_common_closure(variant: str) -> None:
    pinned = pins(f"{variant}.txt")
    assert pinned["torch"] == f"2.13.0+{TORCH_BUILDS[variant]}"
    assert build.torch_pin(ROOT, f"{variant}.txt") == "2.13.0"
    assert pins("common.txt").items() <= pinned.items()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+]*", version) for version in pinned.values())


@pytest.mark.parametrize("variant", ["cu126", "cu129", "rocm64"])
def test_gpu_variants_carry_deepspeed(variant: str) -> None:
    assert pins(f"{variant}.txt")["deepspeed"] == pins("deepspeed.txt")["deepspeed"]
    assert "DS_BUILD_OPS=0" in DOCKERFILE


def test_cpu_carries_no_gpu_package() -> None:
    assert not {"deepspeed", "triton"} & set(pins("cpu.txt"))
    assert not any(name.startswith("nvidia-") for name in pins("cpu.txt"))


def test_the_mps_bundle_pins_pypis_macos_torch() -> None:
    assert pins("mps.txt")["torch"] == "2.13.0"


def test_the_standin_is_labelled_as_one_and_differs_only_in_torch() -> None:
    text = (REQUIREMENTS / "ci-standin-cu126.txt").read_text()
    assert text.startswith("# STAND-IN, NOT A RELEASE REQUIREMENTS SET.")
    standin, real = pins("ci-standin-cu126.txt"), pins("cu126.txt")
    assert {k: v for k, v in standin.items() if k != "torch"} == {
        k: v for k, v in real.items() if k != "torch"
    }
    assert standin["torch"] == "2.13.0+cpu"
