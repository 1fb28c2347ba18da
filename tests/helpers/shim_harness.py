"""Helpers for the shim's tests: a job's work dir the way the worker makes it (owned by the
worker's uid, a listening 0600 bridge socket inside), the job JSON, the shim's command."""

from __future__ import annotations

import grp
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repo_paths import TESTS

STAND_IN = TESTS / "shim" / "fake_image"
TEST_IMAGE = "hypha-accelerate-shim-test:latest"
BASE_IMAGE = "hypha-accelerate-base:bookworm"
# The worker's user: not root and not the test runner, so ownership mistakes show.
WORKER_UID = WORKER_GID = 4321
SECRET_TOKEN = "hf_shimTestSecretToken0123456789"
JOB_LABEL = "hypha.accelerate.job-id"


# libp2p peer ids: base58 of an identity multihash of an Ed25519 key, as serde requires.
PEER = "12D3KooWJ6MBkbH3o7j2yhhDAF7gRxA4Zm5cpuEUr2Znp1VvNBw3"
SCHEDULER_PEER = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"


def job_spec(job_id: str) -> dict[str, Any]:
    peers = {"type": "peers", "peers": [PEER], "strategy": {"type": "All"}}
    return {
        "job_id": job_id,
        "executor": {
            "class": "train",
            "descriptor": {"name": "diloco-transformer"},
            "config": {
                "model": {
                    "task": "causal-lm",
                    "artifact": {
                        "type": "huggingface",
                        "repository": "local/tiny",
                        "revision": None,
                        "filenames": ["config.json"],
                        "token": SECRET_TOKEN,
                    },
                    "input-names": ["input_ids", "labels"],
                },
                "data": {"type": "scheduler", "peer": SCHEDULER_PEER, "dataset": "d"},
                "updates": peers,
                "results": peers,
                "optimizer": {"learning-rate": 0.001, "betas": None, "epsilon": None},
                "batch_size": 4,
            },
        },
    }


def aggregate_job(job_id: str) -> dict[str, Any]:
    """A well-formed job for the worker's built-in parameter server."""
    peers = {"type": "peers", "peers": [PEER], "strategy": {"type": "All"}}
    return {
        "job_id": job_id,
        "executor": {
            "class": "aggregate",
            "descriptor": {"name": "parameter-server"},
            "config": {
                "updates": peers,
                "results": peers,
                "optimizer": {"learning-rate": 0.7, "momentum": 0.9},
            },
        },
    }


class MissingBaseImage(Exception):
    pass


def ensure_test_image(api: Any) -> str:
    """The stand-in executor image (fake_image/), built when missing or out of date."""
    from docker.errors import ImageNotFound

    digest = hashlib.sha256(
        b"".join((STAND_IN / name).read_bytes() for name in ("Dockerfile", "fake_executor.py"))
    ).hexdigest()
    try:
        labels = api.inspect_image(TEST_IMAGE)["Config"]["Labels"] or {}
        if labels.get("hypha.test.digest") == digest:
            return TEST_IMAGE
    except ImageNotFound:
        pass
    try:
        api.inspect_image(BASE_IMAGE)
    except ImageNotFound:
        raise MissingBaseImage(f"{BASE_IMAGE} (docker/make-base-image.sh makes it)") from None
    for chunk in api.build(
        path=str(STAND_IN),
        tag=TEST_IMAGE,
        rm=True,
        labels={"hypha.test.digest": digest},
        decode=True,
    ):
        if "error" in chunk:
            raise RuntimeError(f"building {TEST_IMAGE}: {chunk['error']}")
    return TEST_IMAGE


def shim_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hypha.accelerate_executor.cli", *args]


def docker_gid() -> int | None:
    try:
        return grp.getgrnam("docker").gr_gid
    except KeyError:
        return None


@dataclass
class WorkerJob:
    """One job as the worker sets it up: WORK_DIR (0700, the worker's uid), the bridge
    socket listening inside it (0600), the job JSON."""

    work_dir: Path
    job_id: str
    uid: int
    gid: int
    listener: socket.socket | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def socket_path(self) -> Path:
        return self.work_dir / "bridge.sock"

    @property
    def job_json(self) -> str:
        return json.dumps(job_spec(self.job_id))

    def serve_bridge(self) -> None:
        """Listens on the socket and hangs up on every connection: enough to show that
        the executor can reach it (an unaccepted backlog would fill up over repeats)."""
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(self.socket_path))
        self.listener.listen(16)
        os.chown(self.socket_path, self.uid, self.gid)
        self.socket_path.chmod(0o600)
        threading.Thread(target=_hang_up_on_all, args=(self.listener,), daemon=True).start()

    def bridge_away(self) -> None:
        """What the worker does once its child is gone: stop the bridge, delete the socket."""
        if self.listener is not None:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            self.listener.close()
            self.listener = None
        self.socket_path.unlink(missing_ok=True)

    def plan(self, **plan: Any) -> None:
        """What the stand-in executor does (see fake_image/fake_executor.py)."""
        path = self.work_dir / "plan.json"
        path.write_text(json.dumps(plan))
        os.chown(path, self.uid, self.gid)

    def run_args(
        self, *extra: str, variant: str = "cpu", image: str | None = TEST_IMAGE, job: bool = True
    ) -> list[str]:
        """The shim's arguments; `job`: with --job (by hand), or not (the job in JOB_JSON)."""
        args = ["run", "--variant", variant]
        args += ["--image", image] if image else []
        args += ["--socket", str(self.socket_path), "--work-dir", str(self.work_dir)]
        return [*args, *(["--job", self.job_json] if job else []), *extra]

    def start(self, *extra: str, **popen: Any) -> subprocess.Popen[bytes]:
        """Starts the shim the way the worker does: the job in JOB_JSON, stdout piped."""
        env = {**os.environ, "JOB_JSON": self.job_json, **popen.pop("env", {})}
        process = subprocess.Popen(
            shim_command(*self.run_args(*extra, job=False)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            **popen,
        )
        self.processes.append(process)
        return process

    def run(
        self, *extra: str, timeout: float = 60, **popen: Any
    ) -> subprocess.CompletedProcess[bytes]:
        process = self.start(*extra, **popen)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def containers(self, api: Any) -> list[dict[str, Any]]:
        return list(api.containers(all=True, filters={"label": f"{JOB_LABEL}={self.job_id}"}))


def new_worker_job(base: Path) -> WorkerJob:
    """A job's work dir under `base` as the worker makes it, its bridge listening."""
    work_dir = base / f"hypha-{uuid.uuid4()}"
    work_dir.mkdir(mode=0o700)
    os.chown(work_dir, WORKER_UID, WORKER_GID)
    job = WorkerJob(work_dir, str(uuid.uuid4()), WORKER_UID, WORKER_GID)
    job.serve_bridge()
    job.plan()
    return job


def _hang_up_on_all(listener: socket.socket) -> None:
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:  # closed: the bridge went away
            return
        connection.close()


def wait_for_line(
    process: subprocess.Popen[bytes], wanted: bytes, timeout: float = 30
) -> list[bytes]:
    """Reads the shim's stdout up to a line equal to `wanted`; returns the lines read."""
    assert process.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.rstrip(b"\n") == wanted:
            return lines
    raise AssertionError(f"no {wanted!r} line; got {lines!r}")


def wait_until(condition: Any, timeout: float, interval: float = 0.05) -> float:
    """Polls `condition` until true; returns the seconds it took, fails after `timeout`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true after {timeout} s")
        time.sleep(interval)
    return time.monotonic() - start


def build_small_image(api: Any, arch: str, tag: str) -> str:
    """A FROM scratch image for linux/ARCH holding one file that names it; its id."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (
            ("Dockerfile", b"FROM scratch\nCOPY arch /arch\n"),
            ("arch", f"{arch} {tag}\n".encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    for event in api.build(
        fileobj=context,
        custom_context=True,
        tag=tag,
        platform=f"linux/{arch}",
        nocache=True,
        rm=True,
        decode=True,
    ):
        assert "error" not in event, event
    found = api.inspect_image(tag)
    assert found["Architecture"] == arch
    return str(found["Id"])
