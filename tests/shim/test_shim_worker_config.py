"""`hypha-accelerate worker-config`: entries that parse, carry every hardening flag, and run."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from shim_harness import TEST_IMAGE, WORKER_GID, WORKER_UID, WorkerJob, shim_command

from hypha.accelerate_executor.shim.variants import CONTAINER_VARIANTS, image_tags

TOKENS = ["--socket", "{SOCKET_PATH}", "--work-dir", "{WORK_DIR}", "--job", "{JOB_JSON}"]
HARDENING = [
    ["--network", "none"],
    ["--read-only"],
    ["--cap-drop", "ALL"],
    ["--security-opt", "no-new-privileges"],
    ["--tmpfs", "/tmp:rw,exec,nosuid,nodev"],
    ["--pids-limit", "4096"],
    ["--init"],
    ["--rm"],
    ["--volume", "{WORK_DIR}:{WORK_DIR}"],
]


def worker_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shim_command("worker-config", *args), capture_output=True, text=True, check=False
    )


def entries(*args: str) -> list[dict[str, Any]]:
    result = worker_config(*args)
    assert result.returncode == 0, result.stderr
    document = tomllib.loads(result.stdout)
    assert set(document) == {"executors"}
    for entry in document["executors"]:
        assert (entry["class"], entry["name"], entry["runtime"]) == (
            "train",
            "diloco-transformer",
            "process",
        )
    return list(document["executors"])


def _has(args: list[str], flags: list[str]) -> bool:
    return any(args[i : i + len(flags)] == flags for i in range(len(args)))


@pytest.mark.parametrize("variant", CONTAINER_VARIANTS)
def test_both_entries_parse_and_carry_the_hardening(variant: str) -> None:
    shim, docker = entries("--variant", variant, "--user", "1234:99")
    assert Path(shim["cmd"]).name == "hypha-accelerate"
    assert shim["args"] == ["run", "--variant", variant, *TOKENS]
    assert docker["cmd"] == "docker"
    args = docker["args"]
    assert args[0] == "run"
    for flags in [*HARDENING, ["--user", "1234:99"]]:
        assert _has(args, flags), flags
    assert args[-7:] == [image_tags(variant)[0], *TOKENS]
    assert _has(args, ["--gpus", "all"]) == variant.startswith("cu")
    assert _has(args, ["--device", "/dev/kfd"]) == (variant == "rocm64")


def test_docker_entry_says_the_job_is_visible() -> None:
    result = worker_config("--variant", "cpu", "--mode", "docker")
    assert "docker inspect" in result.stdout and "Prefer the shim" in result.stdout
    [entry] = tomllib.loads(result.stdout)["executors"]
    assert entry["cmd"] == "docker"


def test_default_user_is_the_callers() -> None:
    import os

    [docker] = entries("--variant", "cpu", "--mode", "docker")
    assert _has(docker["args"], ["--user", f"{os.getuid()}:{os.getgid()}"])


def test_mps_host_is_a_shim_entry_with_its_bundle(tmp_path: Path) -> None:
    [shim] = entries("--variant", "mps-host", "--bundle", str(tmp_path))
    assert shim["args"] == ["run", "--variant", "mps-host", "--bundle", str(tmp_path), *TOKENS]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--variant", "mps-host", "--mode", "docker", "--bundle", "/b"], "not a container"),
        (["--variant", "mps-host"], "--bundle"),
        (["--variant", "cpu", "--bundle", "/b"], "--bundle"),
        (["--variant", "cpu", "--user", "me"], "UID:GID"),
        (["--variant", "tpu"], "--variant"),
    ],
)
def test_errors(args: list[str], words: str) -> None:
    result = worker_config(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("hypha-accelerate worker-config: ") and words in line


@pytest.mark.docker
def test_docker_entry_runs_as_the_worker_would(fake_image: str, worker_job: WorkerJob) -> None:
    """The docker CLI takes every flag, tokens substituted the worker's way (the stand-in
    image in place of the executor's)."""
    from hypha.accelerate_executor.local.worker import substitute

    [docker] = entries(
        "--variant", "cpu", "--mode", "docker", "--user", f"{WORKER_UID}:{WORKER_GID}"
    )
    values = {
        "SOCKET_PATH": str(worker_job.socket_path),
        "WORK_DIR": str(worker_job.work_dir),
        "JOB_JSON": worker_job.job_json,
    }
    args = [substitute(arg, values) for arg in docker["args"]]
    args[args.index(image_tags("cpu")[0])] = TEST_IMAGE
    worker_job.plan(write_files=True)
    result = subprocess.run(["docker", *args], capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert b"bridge reachable" in result.stdout
    assert f"uid {WORKER_UID} gid {WORKER_GID}".encode() in result.stdout
