"""Action-era stand-in bridges for the system tests: a scripted backend whose pushes the test controls, and an executor run against one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from hypha.accelerate_executor.protocol.actions.messages import (
    action_response,
)
from hypha.standin.actions.bridge_http import ActionBridgeServer
from hypha.standin.backend import Push
from hypha.standin.coordinator.in_process import InProcessBackend
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets

EXECUTOR = [sys.executable, "-m", "hypha.accelerate_executor.training"]


PS = "12D3KooWJ6MBkbH3o7j2yhhDAF7gRxA4Zm5cpuEUr2Znp1VvNBw3"


JOB_ID = "0b7f3c52-9a1e-4c55-8d2a-3f6e1b9d4a10"


class ScriptedBackend(InProcessBackend):
    """A real coordinator's model store and data node behind the bridge, with a scripted
    scheduler: `script(status)` answers each status; pushes to the job come from `pushes`;
    what the executor sends is kept in `sent`."""

    def __init__(self, coordinator: Coordinator, job_id: str, script: Any) -> None:
        super().__init__(coordinator, job_id)
        self.script = script
        self.statuses: list[dict[str, Any]] = []
        self.sent: list[tuple[str, bytes]] = []
        self.pushes: list[Push] = []
        self.handed = 0  # the last push the bridge has taken
        self.on_send: Callable[[], None] | None = None  # the parameter server's side of a send
        self._lock = threading.Condition()

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        details = request["status"]["details"]
        with self._lock:
            self.statuses.append(details)
        return action_response(request["job_id"], self.script(details))

    def send(self, peer: str, data: bytes) -> None:
        self.sent.append((peer, data))
        if self.on_send is not None:
            self.on_send()

    def next_push(self, after: int, wait_s: float) -> Push | None:
        with self._lock:
            ready = [push for push in self.pushes if push.seq > after]
            if not ready:
                self._lock.wait(wait_s)
                ready = [push for push in self.pushes if push.seq > after]
            if ready:
                self.handed = ready[0].seq
            return ready[0] if ready else None

    def push(self, data: bytes) -> int:
        with self._lock:
            self.pushes.append(Push(len(self.pushes) + 1, PS, data))
            self._lock.notify_all()
            return len(self.pushes)


def until(condition: Any, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.05)


def push_once_receiving(bridge: ActionBridgeServer, backend: ScriptedBackend, data: bytes) -> None:
    """Pushes `data` once a receive is open, on a thread: the bridge is strict."""

    def push() -> None:
        until(lambda: bridge.receives_open() > 0)
        backend.push(data)

    threading.Thread(target=push, daemon=True).start()


@contextmanager
def action_bridge(
    assets_dir: Path, work_dir: Path, script: Any, strict_receive: bool = True
) -> Iterator[tuple[str, ActionBridgeServer, ScriptedBackend]]:
    options = RunOptions(workers=1, rounds=50, generation="actions")
    coordinator = build_coordinator(Catalog.from_assets(ensure_assets(assets_dir)), options)
    job_json = json.dumps(coordinator.assign_job("w1"))
    job_id = json.loads(job_json)["job_id"]
    backend = ScriptedBackend(coordinator, job_id, script)
    work_dir.mkdir()
    bridge = ActionBridgeServer(work_dir, backend, job_id=job_id, strict_receive=strict_receive)
    bridge.start()
    try:
        yield job_json, bridge, backend
    finally:
        bridge.stop()


def later(seconds: float) -> float:
    return time.time() + seconds


def zero_update(assets_dir: Path) -> bytes:
    catalog = Catalog.from_assets(ensure_assets(assets_dir))
    model = catalog.models_dir / catalog.model_repository / "model.safetensors"
    return save({name: torch.zeros_like(t) for name, t in load(model.read_bytes()).items()})


def run_executor(job_json: str, bridge: ActionBridgeServer) -> subprocess.Popen[str]:
    env = {**os.environ, "JOB_JSON": job_json}
    return subprocess.Popen(
        [*EXECUTOR, "--socket", str(bridge.socket_path), "--work-dir", str(bridge.work_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
