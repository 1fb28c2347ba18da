"""The GPU variants' stage graph, built for real with a stand-in: VARIANT=cu126 offline from
docker/requirements/ci-standin-cu126.txt, which is cu126's pins with the CPU torch wheel in
place of torch+cu126 (the CUDA wheels cannot be fetched here).

Exercised for real: the wheel, venv and runtime stages with VARIANT=cu126, DeepSpeed built
from its sdist into the wheelhouse and installed with DS_BUILD_OPS=0, the venv checks, the
labels and the launcher's GPU-variant behaviour. Not exercised: the CUDA torch build and
its nvidia-* wheels, and anything that needs a GPU."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from image_harness import docker_run, hypha_accelerate

pytestmark = pytest.mark.docker

STANDIN_IMAGE = "hypha-accelerate-executor:ci-standin-cu126"


@pytest.fixture(scope="module")
def standin_image(docker_api: Any) -> str:
    # Always through the build command: its layer cache makes a repeat take seconds.
    built = hypha_accelerate(
        "build",
        "cu126",
        "--offline",
        "--requirements",
        "ci-standin-cu126.txt",
        "--tag",
        STANDIN_IMAGE,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    assert re.search(r"^build cu126 \[ *[0-9.]+s\] step 1/\d+: ", built.stdout, re.M)
    return STANDIN_IMAGE


def test_labels_name_the_variant(docker_api: Any, standin_image: str) -> None:
    labels = docker_api.inspect_image(standin_image)["Config"]["Labels"]
    assert labels["io.hypha.accelerate-executor.variant"] == "cu126"
    assert labels["io.hypha.accelerate-executor.torch-version"] == "2.13.0"


def test_deepspeed_is_installed_without_built_ops(standin_image: str) -> None:
    probe = (
        "import json, pathlib, deepspeed\n"
        "from deepspeed.git_version_info import installed_ops\n"
        "root = pathlib.Path(deepspeed.__file__).parent\n"
        "print(json.dumps({'version': deepspeed.__version__,\n"
        "  'built': sorted(k for k, v in installed_ops.items() if v),\n"
        "  'shared_objects': sorted(p.name for p in root.rglob('*.so'))}))\n"
    )
    result = docker_run(
        standin_image, "-c", probe, options=("--entrypoint", "/opt/venv/bin/python")
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"version": "0.19.8", "built": [], "shared_objects": []}


def test_auto_picks_the_cpu_config_when_no_gpu_is_visible(standin_image: str) -> None:
    result = docker_run(standin_image, "--print-config")
    assert result.returncode == 0, result.stderr
    assert (
        "accelerate config: /opt/hypha/accelerate-configs/cpu.yaml (auto: the cu126 image "
        "sees no GPU, so it trains on the CPU (run the container with --gpus all for the GPU))"
        in result.stdout
    )


@pytest.mark.parametrize("config", ["deepspeed-zero2", "deepspeed-zero3", "fsdp", "multi-gpu"])
def test_distributed_configs_go_through_accelerate_launch(standin_image: str, config: str) -> None:
    result = docker_run(
        standin_image, "--print-config", "--accelerate-config", config, "--num-processes", "2"
    )
    assert result.returncode == 0, result.stderr
    assert f"/opt/hypha/accelerate-configs/{config}.yaml (given)" in result.stdout
    assert "-m accelerate.commands.launch" in result.stdout and "--num_processes 2" in result.stdout
