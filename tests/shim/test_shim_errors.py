"""Every failure a user can cause: one line on stderr, a non-zero exit, nothing on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from shim_harness import (
    SECRET_TOKEN,
    WORKER_GID,
    WORKER_UID,
    WorkerJob,
    aggregate_job,
    shim_command,
)


def _fails(
    args: list[str], code: int, *words: str, env: dict[str, str] | None = None, **popen: Any
) -> str:
    result = subprocess.run(
        shim_command(*args),
        capture_output=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
        **popen,
    )
    err = result.stderr.decode()
    assert result.returncode == code, err
    assert result.stdout == b""
    [line] = err.splitlines()
    assert line.startswith("hypha-accelerate run: "), line
    assert SECRET_TOKEN not in line
    for word in words:
        assert word in line, line
    return line


def _replace(args: list[str], option: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(option) + 1] = value
    return args


def _without(args: list[str], option: str) -> list[str]:
    i = args.index(option)
    return args[:i] + args[i + 2 :]


ARGUMENT_ERRORS: dict[str, tuple[Callable[[WorkerJob], list[str]], tuple[str, ...]]] = {
    "unknown variant": (lambda j: _replace(j.run_args(), "--variant", "tpu"), ("--variant",)),
    "no socket": (lambda j: _without(j.run_args(), "--socket"), ("--socket",)),
    "bad user": (lambda j: j.run_args("--user", "worker"), ("UID:GID",)),
    "bad memory": (lambda j: j.run_args("--memory", "lots"), ("--memory",)),
    "shm and ipc": (lambda j: j.run_args("--shm-size", "2g", "--ipc", "host"), ("--ipc",)),
    "gpus on cpu": (lambda j: j.run_args("--gpus", "all"), ("--gpus",)),
    "image on mps-host": (
        lambda j: j.run_args(variant="mps-host"),
        ("--image", "mps-host"),
    ),
    "bundle on cpu": (lambda j: j.run_args("--bundle", "/tmp"), ("--bundle",)),
    "work dir missing": (
        lambda j: _replace(j.run_args(), "--work-dir", str(j.work_dir / "nope")),
        ("does not exist",),
    ),
    "socket missing": (
        lambda j: _replace(j.run_args(), "--socket", str(j.work_dir / "nope.sock")),
        ("nope.sock", "does not exist"),
    ),
    "socket not a socket": (
        lambda j: _replace(j.run_args(), "--socket", str(j.work_dir / "plan.json")),
        ("not a Unix socket",),
    ),
    "socket outside work dir": (
        lambda j: _replace(j.run_args(), "--work-dir", str(j.work_dir / "sub")),
        ("outside work dir",),
    ),
    "job not JSON": (
        lambda j: _replace(j.run_args(), "--job", "{" + SECRET_TOKEN),
        ("bad job", "not valid JSON"),
    ),
    "aggregate job": (
        lambda j: _replace(j.run_args(), "--job", json.dumps(aggregate_job(j.job_id))),
        ("bad job", "parameter server"),
    ),
    "no job at all": (lambda j: j.run_args(job=False), ("--job", "JOB_JSON")),
    "job file missing": (
        lambda j: _replace(j.run_args(), "--job", f"@{j.work_dir}/nope.json"),
        ("cannot read job file", "No such file"),
    ),
}


@pytest.mark.parametrize("case", ARGUMENT_ERRORS)
def test_argument_errors(case: str, worker_job: WorkerJob) -> None:
    (worker_job.work_dir / "sub").mkdir()
    make_args, words = ARGUMENT_ERRORS[case]
    _fails(make_args(worker_job), 2, *words)


def test_docker_unreachable(worker_job: WorkerJob) -> None:
    _fails(
        worker_job.run_args(),
        125,
        "cannot reach the Docker engine at unix:///nonexistent/docker.sock",
        "No such file or directory",
        env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )


def test_docker_socket_not_allowed(worker_job: WorkerJob) -> None:
    if not os.path.exists("/var/run/docker.sock") or os.getuid() != 0:
        pytest.skip("needs root to run the shim as a user outside the docker group")
    _fails(
        worker_job.run_args(),
        125,
        "cannot reach the Docker engine",
        "Permission denied",
        user=WORKER_UID,
        group=WORKER_GID,
        extra_groups=[],
        env={"DOCKER_HOST": ""},
    )


@pytest.mark.docker
def test_named_image_missing(docker_api: Any, worker_job: WorkerJob) -> None:
    _fails(
        worker_job.run_args(image="hypha-no-such-image:nope"),
        125,
        "image hypha-no-such-image:nope not found",
    )


@pytest.mark.docker
def test_variant_image_missing_names_the_build_command(
    docker_api: Any, worker_job: WorkerJob
) -> None:
    from hypha.accelerate_executor.platform.image_tags import image_tags

    if any(docker_api.images(name=tag) for tag in image_tags("rocm64")):
        pytest.skip("a rocm64 image exists on this engine")
    _fails(
        worker_job.run_args(variant="rocm64", image=None),
        125,
        *image_tags("rocm64"),
        "`hypha-accelerate build rocm64`",
    )


@pytest.mark.docker
def test_nvidia_runtime_missing(fake_image: str, docker_api: Any, worker_job: WorkerJob) -> None:
    if "nvidia" in (docker_api.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime")
    _fails(
        worker_job.run_args(variant="cu126"),
        125,
        "cu126 needs the NVIDIA container toolkit",
        "nvidia-ctk",
    )
    assert worker_job.containers(docker_api) == []


@pytest.mark.docker
def test_rocm_devices_missing(fake_image: str, docker_api: Any, worker_job: WorkerJob) -> None:
    if os.path.exists("/dev/kfd"):
        pytest.skip("this host has /dev/kfd")
    _fails(worker_job.run_args(variant="rocm64"), 125, "/dev/kfd")


@pytest.mark.docker
def test_job_file_for_another_user_needs_root(fake_image: str, worker_job: WorkerJob) -> None:
    """A shim running as the worker cannot hand the job file to a different --user."""
    from shim_harness import docker_gid

    gid = docker_gid()
    if gid is None or os.getuid() != 0:
        pytest.skip("needs root and a docker group to run the shim as the worker's user")
    _fails(
        worker_job.run_args("--user", "1234:1234"),
        2,
        "cannot hand the job file to uid:gid 1234:1234",
        user=WORKER_UID,
        group=WORKER_GID,
        extra_groups=[gid],
    )


def test_without_docker_py_the_shim_names_the_extra(worker_job: WorkerJob) -> None:
    """The bare install lacks docker-py; a container job then says how to get it."""
    script = (
        "import sys; sys.modules['docker'] = None; "
        "from hypha.accelerate_executor.cli import main; "
        f"sys.exit(main({worker_job.run_args()!r}))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False)
    assert result.returncode == 125
    [line] = result.stderr.decode().splitlines()
    assert "pip install 'hypha-accelerate-executor[shim]'" in line
    assert result.stdout == b""


def test_help_works_without_anything() -> None:
    result = subprocess.run(shim_command("run", "--help"), capture_output=True, check=False)
    assert result.returncode == 0
    assert b"--variant" in result.stdout
