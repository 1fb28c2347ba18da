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
    result = worker_job.run("--trust-remote-code")
    assert result.returncode == 3
    out = result.stdout.decode("utf-8")  # strict: the worker stops at the first bad line
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("line ")] == [f"line {i}" for i in range(200)]
    assert "bad \ufffd\ufffd bytes \u20ac" in lines
    assert "bridge reachable" in lines  # the 0600 socket, through the mount, as the worker uid
    assert f"uid {WORKER_UID} gid {WORKER_GID} groups [{WORKER_GID}]" in lines
    assert "env trust 1" in lines
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
    assert info["Config"]["Env"] is None or not any(
        e.startswith(("JOB_JSON", "HYPHA_TRUST")) for e in info["Config"]["Env"]
    )
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


def test_the_shim_runs_without_torch(fake_image: str, worker_job: WorkerJob) -> None:
    """The host side installs without torch: a job, worker-config and doctor all run with
    the training stack made unimportable."""
    worker_job.plan()
    block = "import sys; sys.modules.update(torch=None, transformers=None, accelerate=None); "
    for args, codes in (
        (worker_job.run_args(), {0}),
        (["worker-config", "--variant", "cu126"], {0}),
        # 1 where this engine has no cpu image; either way it got to its verdict.
        (["doctor", "--work-dir-base", str(worker_job.work_dir.parent)], {0, 1}),
    ):
        script = block + f"from hypha.accelerate_executor.cli import main; sys.exit(main({args!r}))"
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, timeout=120, check=False
        )
        assert result.returncode in codes, result.stderr
        assert b"Traceback" not in result.stderr
