"""The arm64 cpu image (the variants table's arm64 row: PyPI's torch 2.10.0 for aarch64, a
CPU build), built offline on this host under QEMU user emulation when the host is amd64:
its architecture, its torch without CUDA, and the 2-round job as an arbitrary non-root uid
with no network, under the production hardening. Marked arm64 and left out by default (tens
of minutes under emulation): `HYPHA_ARM64=1 bash tests/run.sh` or `pytest -m arm64` runs them."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from hypha.accelerate_executor.platform.image_tags import image_tags
from hypha.accelerate_executor.platform.variants import BUILDS
from hypha.standin.coordinator.server import RunOptions
from image_harness import (
    check_cuda_libraries,
    docker_entry,
    docker_run,
    ensure_image,
    run_job,
)

pytestmark = [pytest.mark.docker, pytest.mark.arm64, pytest.mark.slow]

ROW = BUILDS[("cpu", "arm64")]

PROBE = r"""
import importlib.metadata as md, json, os, platform, torch
print(json.dumps({
    "machine": platform.machine(), "uid": os.getuid(), "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "nvidia": sorted(d.metadata["Name"] for d in md.distributions()
                     if d.metadata["Name"].lower().startswith(("nvidia-", "triton"))),
    "matmul": float((torch.ones(2, 3) @ torch.ones(3, 2)).sum()),
}))
"""


@pytest.fixture(scope="module")
def arm64_image(docker_api: Any) -> str:
    """This version's arm64 cpu image, built offline once when missing (tests/run.sh builds
    it first under HYPHA_ARM64=1, so normally this only finds it)."""
    return ensure_image(
        docker_api, image_tags("cpu", "arm64")[0], "cpu", "--arch", "arm64", "--offline"
    )


def test_the_image_is_arm64_with_the_rows_cpu_torch(docker_api: Any, arm64_image: str) -> None:
    found = docker_api.inspect_image(arm64_image)
    assert (found["Os"], found["Architecture"]) == ("linux", "arm64")
    labels = found["Config"]["Labels"]
    assert labels["io.hypha.accelerate-executor.variant"] == "cpu"
    assert labels["io.hypha.accelerate-executor.torch-version"] == ROW.torch
    probe = docker_run(arm64_image, "python", "-c", PROBE, options=["--entrypoint", ""])
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen == {
        "machine": "aarch64",
        "uid": 4321,
        # PyPI's aarch64 2.10.0 names itself a CPU build, though its pin carries no label.
        "torch": f"{ROW.torch}+cpu",
        "cuda": None,
        "nvidia": [],
        "matmul": 12.0,
    }
    print(f"arm64 cpu image: {found['Size'] / 1e9:.2f} GB, torch {seen['torch']}")


# Both generations of the Hypha side; each keys its metrics by its own round numbers.
@pytest.mark.parametrize(("generation", "rounds"), [("alpha17", [1, 2]), ("actions", [0, 1])])
def test_two_round_job_in_the_arm64_image(
    arm64_image: str, work_base: Path, generation: Literal["alpha17", "actions"], rounds: list[int]
) -> None:
    # One torch thread and two steps a round: under QEMU, a second OpenMP thread spinning on
    # an emulated core costs more than it brings (with two threads and four steps a round
    # the job had not finished its first round after 20 minutes on a loaded 2-core host).
    # QEMU_CPU=neoverse-n1 (no SVE, like Apple silicon): torch's SVE matmuls emulate 15-20
    # times slower than its NEON ones. On a native arm64 host the variable is not read.
    entry = docker_entry(arm64_image)
    env = ("--env", "OMP_NUM_THREADS=1", "--env", "QEMU_CPU=neoverse-n1")
    entry = dataclasses.replace(entry, args=(entry.args[0], *env, *entry.args[1:]))
    started = time.monotonic()
    options = RunOptions(workers=1, rounds=2, steps_per_round=2, generation=generation)
    record = run_job(entry, work_base, options)
    took = time.monotonic() - started
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert sorted(record["metrics"]) == rounds
    assert record["leaks"] == []
    emulated = "under QEMU" if os.uname().machine != "aarch64" else "native"
    print(f"2-round {generation} job in {arm64_image} ({emulated}): {took:.0f} s")


# What an arm64 host's /proc/cpuinfo says (two Neoverse N1 cores). QEMU user emulation shows
# the host's own instead (x86_64's here), which torch 2.13's aarch64 build cannot parse:
# `import torch` dies with SIGSEGV in torch._C's initialisation (2026-11-26, QEMU 7.2).
ARM64_CPUINFO = "".join(
    f"processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 "
    "crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\nCPU implementer\t: "
    "0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
    for n in range(2)
)


@pytest.mark.cuda_image
def test_the_arm64_cu130_image_loads_cuda_cudnn_and_nccl_without_a_gpu(
    docker_api: Any, tmp_path: Path
) -> None:
    """The Grace Hopper/Blackwell and DGX Spark image (a 2.8 GB wheelhouse; marked cuda_image
    too, so only `-m 'arm64 and cuda_image'` runs it)."""
    tag = ensure_image(
        docker_api,
        image_tags("cu130", "arm64")[0],
        *("cu130", "--arch", "arm64", "--offline"),
        timeout=7200,
    )
    assert docker_api.inspect_image(tag)["Architecture"] == "arm64"
    options: tuple[str, ...] = ()
    if os.uname().machine != "aarch64":
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text(ARM64_CPUINFO)
        cpuinfo.chmod(0o644)
        options = ("--volume", f"{cpuinfo}:/proc/cpuinfo:ro")
    check_cuda_libraries(tag, "cu130", options, timeout=600)
