"""Helpers for the image tests: the console command, hardened `docker run`, image lookup, and
a job of the local stand-in run in a container the way a worker's TOML entry runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.platform.variants import BY_NAME
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry
from hypha.standin.worker.worker import LocalWorker, serve_one_job
from repo_paths import REPO

ROOT = REPO
CPU_IMAGE = f"hypha-accelerate-executor:{__version__}-cpu"
# The hardening every production run uses; the image must work under all of it.
HARDENED = (
    "--read-only",
    "--tmpfs",
    "/tmp",
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
)
ARBITRARY_USER = "4321:4321"
WORKER_UID, WORKER_GID = (int(part) for part in ARBITRARY_USER.split(":"))


def hypha_accelerate(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """The console command, from this interpreter's environment."""
    return subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def docker_run(
    image: str, *args: str, options: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`docker run --rm` as an arbitrary non-root uid with the production hardening. At the
    timeout the container is removed too: killing the client alone leaves it running."""
    name = f"hypha-test-{uuid.uuid4().hex[:12]}"
    command = ["docker", "run", "--rm", "--name", name, "--user", ARBITRARY_USER, *HARDENED]
    try:
        return subprocess.run(
            [*command, *options, image, *args], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)
        raise


def image_exists(api: Any, name: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        api.inspect_image(name)
    except ImageNotFound:
        return False
    return True


def ensure_image(api: Any, tag: str, *build_args: str, timeout: float = 3600) -> str:
    """`tag`, built by `hypha-accelerate build BUILD_ARGS` when the engine lacks it."""
    if not image_exists(api, tag):
        built = hypha_accelerate("build", *build_args, timeout=timeout)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr
    return tag


# What a CUDA image's torch loads without a GPU: its CUDA runtime, cuDNN and NCCL (and
# DeepSpeed, its headers, none of torch's C++ tests).
CUDA_PROBE = r"""
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
# cuDNN and NCCL: the versions each torch's metadata pins (cu128: nvidia-cudnn-cu12 9.10.2.21,
# nvidia-nccl-cu12 2.27.5; cu130: cuDNN 9.20.0, NCCL 2.29.7), the same on amd64 and arm64.
CUDA_LIBRARIES = {
    "cu128": {"torch": "2.10.0+cu128", "cuda": "12.8", "cudnn": 91002, "nccl": "2.27.5"},
    "cu130": {"torch": "2.13.0+cu130", "cuda": "13.0", "cudnn": 92000, "nccl": "2.29.7"},
}


def check_cuda_libraries(
    tag: str, variant: str, options: Sequence[str] = (), timeout: float = 120
) -> None:
    """CUDA_PROBE in image `tag` of CUDA variant `variant` (either architecture), run hardened
    as a non-root uid on a host without a GPU: its libraries load, in the versions pinned."""
    entry = ("--entrypoint", "/opt/venv/bin/python")
    result = docker_run(tag, "-c", CUDA_PROBE, options=(*entry, *options), timeout=timeout)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        **CUDA_LIBRARIES[variant],
        "available": False,
        "deepspeed": "0.19.8",
        "headers": True,  # kept: DeepSpeed JIT-builds its ops against them
        "tests": False,
    }
    assert CUDA_LIBRARIES[variant]["cuda"] == BY_NAME[variant].runtime


def docker_entry(image: str, *launcher_args: str) -> ExecutorEntry:
    """The worker TOML's docker entry (docs/worker.md, the plain `cmd = "docker"` form,
    without --init)."""
    return ExecutorEntry(
        "docker",
        (
            "run",
            "--rm",
            "--user",
            ARBITRARY_USER,
            *HARDENED,
            # The worker exports the job as JOB_JSON; docker passes it on by name.
            "--env",
            "JOB_JSON",
            "--volume",
            "{WORK_DIR}:{WORK_DIR}",
            image,
            *EXECUTOR_ARGS,
            *launcher_args,
        ),
    )


def run_job(
    entry: ExecutorEntry, work_base: Path, options: RunOptions, cancel_after_batches: int = 0
) -> dict[str, Any]:
    """One job of the local stand-in as worker w1 with the worker's uid; its summary record."""
    coordinator = build_coordinator(Catalog.from_assets(ensure_assets()), options)
    coordinator.start()
    try:
        worker = LocalWorker("w1", entry, work_base, owner=(WORKER_UID, WORKER_GID))
        if cancel_after_batches:
            threading.Thread(
                target=_cancel_when_training,
                args=(coordinator, worker, cancel_after_batches),
                daemon=True,
            ).start()
        serve_one_job(CoordinatorClient(coordinator.url), worker)
        return dict(coordinator.summary()["workers"]["w1"])
    finally:
        coordinator.stop()


def _cancel_when_training(coordinator: Coordinator, worker: LocalWorker, batches: int) -> None:
    while (
        coordinator.summary()["workers"].get("w1", {}).get("rounds", [{}])[0].get("batches", 0)
        < batches
    ):
        time.sleep(0.2)
    worker.cancel()
