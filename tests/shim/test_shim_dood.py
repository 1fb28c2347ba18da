"""The shim inside a container (Compose, docker-out-of-docker): bind sources are host paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.errors import ShimError
from hypha.accelerate_executor.shim.mount_source import translate
from shim_harness import BASE_IMAGE, WorkerJob

REPO = Path(__file__).resolve().parents[2]
MOUNTS = [
    {"Type": "bind", "Source": "/srv/hypha", "Destination": "/work"},
    {"Type": "bind", "Source": "/mnt/fast/jobs", "Destination": "/work/jobs"},
    {
        "Type": "volume",
        "Driver": "local",
        "Source": "/var/lib/docker/volumes/v/_data",
        "Destination": "/vol",
    },
    {"Type": "tmpfs", "Source": "", "Destination": "/scratch"},
]


@pytest.mark.parametrize(
    ("work_dir", "host"),
    [
        ("/work/hypha-1", "/srv/hypha/hypha-1"),
        ("/work/jobs/hypha-2", "/mnt/fast/jobs/hypha-2"),  # the innermost mount wins
        ("/work/jobsx/hypha-3", "/srv/hypha/jobsx/hypha-3"),  # a prefix, not a parent
        ("/vol/hypha-4", "/var/lib/docker/volumes/v/_data/hypha-4"),
    ],
)
def test_translate(work_dir: str, host: str) -> None:
    assert translate(work_dir, MOUNTS) == host


@pytest.mark.parametrize(
    ("work_dir", "words"), [("/else/hypha", "no mount"), ("/scratch/h", "tmpfs")]
)
def test_translate_refuses(work_dir: str, words: str) -> None:
    with pytest.raises(ShimError, match=words):
        translate(work_dir, MOUNTS)


def _shim_in_container(
    api: Any, job: WorkerJob, script: str, mounts: dict[str, Any]
) -> tuple[int, str]:
    """Runs `script` (Python) in a container holding the repository, its venv and the
    engine's socket: the shim's situation under Compose."""
    binds = {
        str(REPO): {"bind": str(REPO), "mode": "ro"},
        "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
        **mounts,
    }
    container = api.create_container(
        BASE_IMAGE,
        command=[str(REPO / ".venv/bin/python"), "-c", script],
        host_config=api.create_host_config(binds=binds, network_mode="none"),
        labels={"hypha.accelerate.job-id": job.job_id + "-shim"},
    )["Id"]
    try:
        api.start(container)
        code = api.wait(container, timeout=120)["StatusCode"]
        return code, api.logs(container).decode()
    finally:
        api.remove_container(container, force=True)


@pytest.mark.docker
def test_shim_in_a_container_mounts_the_host_path(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    inner = "/srv/jobs"
    work_dir = f"{inner}/{worker_job.work_dir.name}"
    args = worker_job.run_args()
    args[args.index("--work-dir") + 1] = work_dir
    args[args.index("--socket") + 1] = f"{work_dir}/bridge.sock"
    worker_job.plan(write_files=True)
    script = (
        "import sys; from hypha.accelerate_executor.cli import main; "
        f"sys.exit(main({json.dumps(args)}))"
    )
    code, logs = _shim_in_container(
        docker_api,
        worker_job,
        script,
        {str(worker_job.work_dir.parent): {"bind": inner, "mode": "rw"}},
    )
    assert code == 0, logs
    assert "bridge reachable" in logs.splitlines()
    assert (worker_job.work_dir / "out" / "deeper" / "b.bin").stat().st_uid == worker_job.uid
    assert worker_job.containers(docker_api) == []


@pytest.mark.docker
def test_shim_in_a_container_refuses_a_work_dir_on_no_mount(
    fake_image: str, worker_job: WorkerJob, docker_api: Any
) -> None:
    args = worker_job.run_args()
    args[args.index("--work-dir") + 1] = "/scratch/w"
    args[args.index("--socket") + 1] = "/scratch/w/bridge.sock"
    script = (
        "import os, socket, sys; os.makedirs('/scratch/w'); "
        "s = socket.socket(socket.AF_UNIX); s.bind('/scratch/w/bridge.sock'); "
        "from hypha.accelerate_executor.cli import main; "
        f"sys.exit(main({json.dumps(args)}))"
    )
    code, logs = _shim_in_container(docker_api, worker_job, script, {})
    assert code == 125
    [line] = logs.splitlines()
    assert line.startswith("hypha-accelerate run: work dir /scratch/w is on no mount"), line
