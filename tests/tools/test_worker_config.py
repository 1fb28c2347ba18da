"""`hypha-accelerate worker-config`: entries that parse, keep the job off every command line,
and run the same hardened container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.platform.image_tags import CONTAINER_VARIANTS, image_tags
from shim_harness import (
    SECRET_TOKEN,
    TEST_IMAGE,
    WORKER_GID,
    WORKER_UID,
    WorkerJob,
    new_worker_job,
    shim_command,
    wait_for_line,
)

TOKENS = ["--socket", "{SOCKET_PATH}", "--work-dir", "{WORK_DIR}"]


def worker_config(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shim_command("worker-config", *args),
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
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
def test_both_entries_parse_and_keep_the_job_off_the_command_line(variant: str) -> None:
    """The worker exports JOB_JSON; an entry with {JOB_JSON} in its args would put the job,
    tokens included, into a process list every local user can read."""
    shim, docker = entries("--variant", variant, "--user", "1234:99")
    assert Path(shim["cmd"]).name == "hypha-accelerate"
    assert shim["args"] == ["run", "--variant", variant, *TOKENS]
    assert docker["cmd"] == "docker"
    args = docker["args"]
    assert not any("{JOB_JSON}" in arg for arg in shim["args"] + args)
    assert _has(args, ["--env", "JOB_JSON"])
    assert args[-5:] == [image_tags(variant)[0], *TOKENS]
    # What needs a GPU host cannot run here: the device requests are all there is to check.
    assert _has(args, ["--gpus", "all"]) == variant.startswith("cu")
    assert _has(args, ["--device", "/dev/kfd"]) == (variant == "rocm64")


def test_docker_entry_says_the_job_is_visible() -> None:
    result = worker_config("--variant", "cpu", "--mode", "docker")
    assert "docker inspect" in result.stdout and "Prefer the shim" in result.stdout
    [entry] = tomllib.loads(result.stdout)["executors"]
    assert entry["cmd"] == "docker"


def test_default_user_is_the_callers() -> None:
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


def fake_host(
    base: Path, gpus: int = 0, driver: str | None = None, rocm: bool = False
) -> dict[str, str]:
    """A host as /dev and /proc/driver/nvidia/version show it, through the test-only overrides."""
    dev = base / "dev"
    dev.mkdir()
    for index in range(gpus):
        (dev / f"nvidia{index}").touch()
    if rocm:
        (dev / "kfd").touch()
        (dev / "dri").mkdir()
    version = base / "version"
    if driver:
        version.write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Sat Aug 19 UTC 2023\n"
        )
    return {"HYPHA_HOST_DEV": str(dev), "HYPHA_NVIDIA_DRIVER_VERSION_FILE": str(version)}


@pytest.mark.parametrize(
    ("host", "variant", "why"),
    [
        (
            {"gpus": 2, "driver": "535.104.05"},
            "cu128",
            "2 NVIDIA GPU(s); NVIDIA driver 535.104.05 runs cu128 (CUDA 12.8) through "
            "minor-version compatibility (natively from 570.26)",
        ),
        (
            {"gpus": 8, "driver": "580.95.05"},
            "cu130",
            "8 NVIDIA GPU(s); NVIDIA driver 580.95.05 runs cu130 (CUDA 13.0) natively",
        ),
        (
            {"gpus": 1, "driver": "560.35.03"},
            "cu126",
            "1 NVIDIA GPU(s); NVIDIA driver 560.35.03 runs cu126 (CUDA 12.6) natively",
        ),
        (
            {"gpus": 1, "driver": "470.256.02"},
            "cpu",
            "1 NVIDIA GPU(s), but driver 470.256.02 runs no CUDA variant (the oldest need: >= 525.60.13)",
        ),
        ({"gpus": 1}, "cpu", "1 NVIDIA GPU(s), but no driver version readable ("),
        ({"rocm": True}, "rocm64", "ROCm devices /dev/kfd and /dev/dri present"),
        ({}, "cpu", "no GPU on this host (no /dev/nvidia<N>, no /dev/kfd)"),
    ],
)
def test_auto_picks_the_variant_this_host_runs_best_and_says_why(
    tmp_path: Path, host: dict[str, Any], variant: str, why: str
) -> None:
    result = worker_config("--variant", "auto", "--mode", "both", env=fake_host(tmp_path, **host))
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()[:2]
    assert first.startswith(f"# --variant auto chose {variant}: {why}")
    assert second.endswith(f"variant {variant}.")
    shim, docker = tomllib.loads(result.stdout)["executors"]
    assert shim["args"][:3] == ["run", "--variant", variant]
    assert image_tags(variant)[0] in docker["args"]
    assert ("--gpus" in docker["args"]) == variant.startswith("cu")


def _as_the_worker_runs(entry: dict[str, Any], job: WorkerJob) -> list[str]:
    """The entry's command with the tokens replaced as the worker replaces them."""
    from hypha.standin.worker.executor_entries import substitute

    values = {"SOCKET_PATH": str(job.socket_path), "WORK_DIR": str(job.work_dir)}
    return [entry["cmd"], *(substitute(arg, values) for arg in entry["args"])]


def _container_of(job: WorkerJob, api: Any, command: list[str], env: dict[str, str]) -> Any:
    """Starts `command` as the worker does (JOB_JSON exported) with a sleeping stand-in
    executor; returns the running container's inspect and the process."""
    job.plan(sleep=60)
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, env={**os.environ, "JOB_JSON": job.job_json, **env}
    )
    job.processes.append(process)
    wait_for_line(process, b"ready")
    # all=True: the engine may not have marked the container running yet when its process
    # has already printed (seen under load); its configuration is set from its creation.
    label = f"hypha.accelerate.work-dir={job.work_dir}"
    [container] = api.containers(all=True, filters={"label": label})
    return api.inspect_container(container["Id"]), process


HARDENING_KEYS = ("NetworkMode", "CapDrop", "SecurityOpt", "ReadonlyRootfs", "Tmpfs",
                  "PidsLimit", "Init", "Privileged", "ShmSize", "Binds")  # fmt: skip


@pytest.mark.docker
def test_both_entries_run_the_same_hardened_container(
    fake_image: str, docker_api: Any, work_base: Path
) -> None:
    """Each entry, started the worker's way with the stand-in image, runs a container with no
    network, no capabilities, no privileges to gain, a read-only root, as the worker's user;
    the two containers agree on every hardening setting."""
    shim, docker = entries(
        "--variant", "cpu", "--mode", "both", "--user", f"{WORKER_UID}:{WORKER_GID}"
    )
    seen = []
    for entry in (shim, docker):
        job = new_worker_job(work_base)
        command = _as_the_worker_runs(entry, job)
        if entry is docker:
            command[command.index(image_tags("cpu")[0])] = TEST_IMAGE
        info, process = _container_of(
            job, docker_api, command, {"HYPHA_ACCELERATE_IMAGE": TEST_IMAGE}
        )
        host = info["HostConfig"]
        assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
        assert host["SecurityOpt"] == ["no-new-privileges"] and host["ReadonlyRootfs"] is True
        assert info["Config"]["User"] == f"{WORKER_UID}:{WORKER_GID}"
        assert "HYPHA_TRUST_REMOTE_CODE=1" in info["Config"]["Env"]
        assert SECRET_TOKEN not in json.dumps(info["Args"]) + json.dumps(info["Config"]["Cmd"])
        seen.append({key: host[key] for key in HARDENING_KEYS if key != "Binds"})
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        job.bridge_away()
    assert seen[0] == seen[1]
