"""The shim running the stand-in executor image on the real engine: output, exit codes,
hardening, ownership, OOM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from shim_harness import (
    SECRET_TOKEN,
    WORKER_GID,
    WORKER_UID,
    WorkerJob,
    docker_gid,
    shim_command,
    wait_for_line,
)

pytestmark = pytest.mark.docker


def test_output_streams_and_exit_code(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    worker_job.plan(lines=200, stderr="a line on stderr", bad_bytes=True, exit=3)
    result = worker_job.run()
    assert result.returncode == 3
    out = result.stdout.decode("utf-8")  # strict: the worker stops at the first bad line
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("line ")] == [f"line {i}" for i in range(200)]
    assert "bad \ufffd\ufffd bytes \u20ac" in lines
    assert "bridge reachable" in lines  # the 0600 socket, through the mount, as the worker uid
    assert f"uid {WORKER_UID} gid {WORKER_GID} groups [{WORKER_GID}]" in lines
    assert f"job id {worker_job.job_id}" in lines
    assert "a line on stderr" not in out
    assert result.stderr.decode() == "a line on stderr\n"
    assert SECRET_TOKEN not in out
    assert worker_job.containers(docker_api) == []


def test_running_container_is_hardened_and_hides_the_job(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    worker_job.plan(sleep=60)
    process = worker_job.start("--memory", "512m", "--pids-limit", "100")
    wait_for_line(process, b"ready")
    [summary] = worker_job.containers(docker_api)
    info = docker_api.inspect_container(summary["Id"])
    assert SECRET_TOKEN not in json.dumps(info)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert info["NetworkSettings"]["Networks"].keys() == {"none"}
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True
    assert host["Tmpfs"].keys() == {"/tmp"}
    assert host["PidsLimit"] == 100
    assert host["Memory"] == host["MemorySwap"] == 512 * 2**20
    assert host["ShmSize"] == 2**30
    assert host["AutoRemove"] is False and host["Init"] is True
    assert host["Privileged"] is False
    assert info["Config"]["User"] == f"{WORKER_UID}:{WORKER_GID}"
    # The sandbox lets a model's own code run; the job itself stays out of the environment.
    assert "HYPHA_TRUST_REMOTE_CODE=1" in info["Config"]["Env"]
    assert not any(e.startswith("JOB_JSON") for e in info["Config"]["Env"])
    [mount] = info["Mounts"]
    assert mount["Source"] == mount["Destination"] == str(worker_job.work_dir)
    assert mount["RW"] is True
    job_file = worker_job.work_dir / ".hypha-job.json"
    assert info["Args"][-2:] == ["--job", f"@{job_file}"]
    labels = info["Config"]["Labels"]
    assert labels["hypha.accelerate.job-id"] == worker_job.job_id
    assert labels["hypha.accelerate.shim-pid"] == str(process.pid)
    assert labels["hypha.accelerate.shim-host"] == os.uname().nodename
    st = job_file.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (WORKER_UID, WORKER_GID, 0o600)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 143


def test_files_left_behind_belong_to_the_worker(fake_image: str, worker_job: WorkerJob) -> None:
    """Run the shim itself as the (non-root) worker's user, as in production; then that user
    must be able to delete the whole work dir, as the worker does."""
    gid = docker_gid()
    if gid is None:
        pytest.skip("no docker group to give the worker's user access to the engine")
    worker_job.plan(write_files=True)
    result = worker_job.run(user=WORKER_UID, group=WORKER_GID, extra_groups=[gid])
    assert result.returncode == 0, result.stderr
    paths = [worker_job.work_dir, *worker_job.work_dir.rglob("*")]
    assert len(paths) > 5
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in paths} == {(WORKER_UID, WORKER_GID)}
    worker_job.bridge_away()
    # The base (root's here) is not the worker's: what counts is everything inside.
    delete = subprocess.run(
        ["find", str(worker_job.work_dir), "-mindepth", "1", "-delete"],
        user=WORKER_UID,
        group=WORKER_GID,
        check=False,
    )
    assert delete.returncode == 0
    assert list(worker_job.work_dir.iterdir()) == []


def test_oom_is_reported_as_such(fake_image: str, worker_job: WorkerJob, docker_api: Any) -> None:
    worker_job.plan(alloc_mb=400)
    result = worker_job.run("--memory", "64m")
    assert result.returncode == 137
    [line] = result.stderr.decode().splitlines()
    assert "out of memory" in line and "OOM-killed" in line and "64m" in line
    assert worker_job.containers(docker_api) == []


def test_sigkill_inside_is_not_called_oom(fake_image: str, worker_job: WorkerJob) -> None:
    worker_job.plan(self_kill=True)
    result = worker_job.run()
    assert result.returncode == 137
    assert b"memory" not in result.stderr


def test_options_reach_the_launcher(fake_image: str, worker_job: WorkerJob) -> None:
    worker_job.plan()
    result = worker_job.run("--accelerate-config", "multi-cpu", "--num-processes", "2")
    assert result.returncode == 0, result.stderr
    assert "extra args ['--accelerate-config', 'multi-cpu', '--num-processes', '2']" in (
        result.stdout.decode().splitlines()
    )


def test_job_as_at_path(fake_image: str, worker_job: WorkerJob, tmp_path: Any) -> None:
    worker_job.plan()
    job_file = tmp_path / "job.json"
    job_file.write_text(worker_job.job_json)
    args = worker_job.run_args()
    args[args.index("--job") + 1] = f"@{job_file}"
    result = subprocess.run(shim_command(*args), capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert f"job id {worker_job.job_id}".encode() in result.stdout


@pytest.mark.parametrize(
    ("extra", "trusted"),
    [
        ([], True),  # the sandbox: no network, read-only root, no capabilities
        (["--no-remote-code"], False),
        (["--network", "bridge"], False),  # a container that can reach out
        (["--network", "bridge", "--trust-remote-code"], True),
    ],
)
def test_remote_code_runs_only_sandboxed_or_trusted(
    fake_image: str, worker_job: WorkerJob, extra: list[str], trusted: bool
) -> None:
    worker_job.plan()
    result = worker_job.run(*extra)
    assert result.returncode == 0, result.stderr
    assert f"env trust {'1' if trusted else '-'}" in result.stdout.decode().splitlines()


def test_the_executor_keeps_only_the_forwarded_variables(
    fake_image: str, worker_job: WorkerJob
) -> None:
    """OMP_NUM_THREADS (its share of the cores) and QEMU_CPU (the emulated CPU model) pass
    from the shim's environment into the container; nothing else of it does."""
    worker_job.plan()
    env = {"OMP_NUM_THREADS": "3", "QEMU_CPU": "neoverse-n1", "HYPHA_SHIM_ONLY": "x"}
    result = worker_job.run(env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert {"env OMP_NUM_THREADS 3", "env QEMU_CPU neoverse-n1", "env HYPHA_SHIM_ONLY -"} <= set(
        lines
    )


def test_the_shim_runs_without_torch(fake_image: str, worker_job: WorkerJob) -> None:
    """The host side installs without torch: a job, worker-config and doctor all run with
    the training stack made unimportable. Doctor meets an engine that is not there, so its
    verdict is known: exit 1."""
    worker_job.plan()
    block = "import sys; sys.modules.update(torch=None, transformers=None, accelerate=None); "
    for args, code, env in (
        (worker_job.run_args(), 0, {}),
        (["worker-config", "--variant", "cu126"], 0, {}),
        (
            ["doctor", "--work-dir-base", str(worker_job.work_dir.parent)],
            1,
            {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
        ),
    ):
        script = block + f"from hypha.accelerate_executor.cli import main; sys.exit(main({args!r}))"
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            timeout=120,
            check=False,
            env={**os.environ, **env},
        )
        assert result.returncode == code, result.stderr
        assert b"Traceback" not in result.stderr


def test_the_compile_cache_outlives_the_job_only_when_asked(
    fake_image: str, worker_job: WorkerJob, tmp_path: Any
) -> None:
    """HYPHA_COMPILE_CACHE: the second job's container finds what the first one's compiled,
    in a host folder per image that belongs to the job's user alone. Without it, the cache
    is the container's own /tmp and dies with it."""
    root = tmp_path / "compile-cache"
    env = {"HYPHA_COMPILE_CACHE": str(root)}
    worker_job.plan(cache_mark="first")
    first = worker_job.run(env=env)
    assert first.returncode == 0, first.stderr
    assert "cache holds []" in first.stdout.decode()
    worker_job.plan(cache_mark="second")
    second = worker_job.run(env=env)
    assert second.returncode == 0, second.stderr
    assert "cache holds ['first']" in second.stdout.decode()
    (folder,) = root.iterdir()
    info = folder.stat()
    assert (info.st_uid, oct(info.st_mode & 0o777)) == (WORKER_UID, "0o700")

    without = worker_job.run()
    assert without.returncode == 0, without.stderr
    assert "cache holds []" in without.stdout.decode()
