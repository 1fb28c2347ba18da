"""The cu130 image, built for real: PyPI's torch 2.13.0 (the CUDA 13.0 build) with its CUDA 13
runtime wheels and DeepSpeed, offline from a wheelhouse made on the host. No GPU here, so
CUDA cannot run, but its libraries must load, and the image must train on the CPU when told.

Marked `cuda_image` and left out of the default run (pyproject's addopts say
`-m "not cuda_image"`), so `bash .ci/run` does not run it: on a fresh CI machine its
wheelhouse is a 2.6 GB download, and wheelhouse and build add about seven minutes and some
17 GB of disk (wheelhouse, its copies in two build stages, the installed venv, the 5.3 GB
image) to a run that has 90 minutes and a disk shared with every other image. Run it with
`pytest -m cuda_image tests/images/test_image_cu130.py`; it builds the image when missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from image_harness import docker_entry, docker_run, hypha_accelerate, image_exists, run_job

from hypha.accelerate_executor.local.coordinator import RunOptions
from hypha.accelerate_executor.shim.variants import image_tags

pytestmark = [pytest.mark.docker, pytest.mark.cuda_image]

CU130_IMAGE = image_tags("cu130")[0]

PROBE = r"""
import json, pathlib, torch
libraries = {"cuda": torch.version.cuda, "available": torch.cuda.is_available(),
             "cudnn": torch.backends.cudnn.version(),
             "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
import deepspeed
root = pathlib.Path(torch.__file__).parent
print(json.dumps({"torch": torch.__version__, **libraries, "deepspeed": deepspeed.__version__,
                  "headers": (root / "include" / "torch" / "extension.h").is_file(),
                  "tests": (root / "test").exists()}))
"""


@pytest.fixture(scope="module")
def cu130_image(docker_api: Any) -> str:
    if not image_exists(docker_api, CU130_IMAGE):
        built = hypha_accelerate("build", "cu130", "--offline", timeout=3600)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    return CU130_IMAGE


def test_labels_name_the_variant_and_torch(docker_api: Any, cu130_image: str) -> None:
    labels = docker_api.inspect_image(cu130_image)["Config"]["Labels"]
    assert labels["io.hypha.accelerate-executor.variant"] == "cu130"
    assert labels["io.hypha.accelerate-executor.torch-version"] == "2.13.0"


def test_cuda_cudnn_and_nccl_load_without_a_gpu_and_deepspeed_imports(cu130_image: str) -> None:
    result = docker_run(cu130_image, "-c", PROBE, options=("--entrypoint", "/opt/venv/bin/python"))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # cuDNN 9.20.0 and NCCL 2.29.7: the versions torch 2.13.0's metadata pins.
    assert found == {
        "torch": "2.13.0+cu130",
        "cuda": "13.0",
        "available": False,
        "cudnn": 92000,
        "nccl": "2.29.7",
        "deepspeed": "0.19.8",
        "headers": True,  # kept: DeepSpeed JIT-builds its ops against them
        "tests": False,
    }


def test_auto_picks_the_cpu_config_when_no_gpu_is_visible(cu130_image: str) -> None:
    result = docker_run(cu130_image, "--print-config")
    assert result.returncode == 0, result.stderr
    assert "/opt/hypha/accelerate-configs/cpu.yaml (auto: the cu130 image sees no GPU" in (
        result.stdout
    )


@pytest.mark.slow
def test_two_round_diloco_job_on_the_cpu_in_the_container(
    cu130_image: str, work_base: Path
) -> None:
    record = run_job(
        docker_entry(cu130_image),
        work_base,
        RunOptions(workers=1, rounds=2, steps_per_round=4),
    )
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert sorted(record["metrics"]) == [1, 2]
    assert record["leaks"] == []
