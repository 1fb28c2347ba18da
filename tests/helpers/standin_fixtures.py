"""Fixtures for the stand-in's tests (a pytest plugin, tests/conftest.py): a real coordinator on TCP, real bridges on Unix sockets."""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hypha.standin.actions.bridge_http import ActionBridgeServer
from hypha.standin.alpha17.bridge_http import Alpha17BridgeServer
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.server import Catalog, Coordinator, RunOptions, build_coordinator
from hypha.standin.worker.bridge_server import BridgeServer


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX: what an executor's bridge client does."""

    def __init__(self, socket_path: Path, timeout: float = 10.0) -> None:
        super().__init__("hypha", timeout=timeout)
        self.socket_path = str(socket_path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)

    def post(
        self, path: str, payload: Any, content_type: str | None = "application/json"
    ) -> tuple[int, str | None, bytes]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = {"Content-Type": content_type} if content_type else {}
        self.request("POST", path, body=body, headers=headers)
        response = self.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()

    def post_json(self, path: str, payload: Any) -> tuple[int, Any]:
        status, _, body = self.post(path, payload)
        return status, json.loads(body) if body else None


class EventStream:
    """Reads an SSE response line by line in the background."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.response = response
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self.response:
                self.lines.put(line)
        except OSError:
            pass
        self.lines.put(None)

    def next_line(self, timeout: float = 10.0) -> bytes | None:
        """The next line, or None once the stream has ended."""
        return self.lines.get(timeout=timeout)

    def next_event(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next `data:` event, skipping comments and blank lines."""
        while True:
            line = self.next_line(timeout)
            assert line is not None, "the stream ended before an event came"
            if line.startswith(b"data:"):
                event: dict[str, Any] = json.loads(line[len(b"data:") :])
                return event


def open_stream(socket_path: Path, body: Any) -> tuple[int, str | None, EventStream]:
    connection = UnixHTTPConnection(socket_path)
    connection.request(
        "POST",
        "/resources/receive",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type"), EventStream(response)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short base path: a Unix socket path must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="hl-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    """A small model store and a four-slice data set, made of real files."""
    models = tmp_path / "models"
    repository = models / "local" / "tiny-gpt2"
    (repository / "tokenizer").mkdir(parents=True)
    (repository / "config.json").write_text('{"model_type": "gpt2"}')
    (repository / "model.safetensors").write_bytes(b"\x01" * 5000)
    (repository / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0"}')
    (models / "uri").mkdir()
    (models / "uri" / "weights.bin").write_bytes(b"\x02" * 300)
    dataset = tmp_path / "datasets" / "toy"
    dataset.mkdir(parents=True)
    for index in range(4):
        tokens = torch.full((2, 8), index, dtype=torch.int64)
        save_file(
            {"input_ids": tokens, "labels": tokens.clone()}, str(dataset / f"{index}.safetensors")
        )
    return Catalog(models, dataset, "toy", "local/tiny-gpt2", ("config.json", "model.safetensors"))


@pytest.fixture
def make_coordinator(catalog: Catalog) -> Iterator[Callable[..., Coordinator]]:
    started: list[Coordinator] = []

    def make(clock: Callable[[], float] = time.monotonic, **options: Any) -> Coordinator:
        # These tests are about alpha.17's bridge and scheduler: the generation is pinned.
        options = {"generation": "alpha17", **options}
        coordinator = build_coordinator(catalog, RunOptions(**options), clock=clock)
        coordinator.start()
        started.append(coordinator)
        return coordinator

    yield make
    for coordinator in started:
        coordinator.stop()


@pytest.fixture
def make_bridge(short_dir: Path) -> Iterator[Callable[..., tuple[BridgeServer, dict[str, Any]]]]:
    """Assigns a job of `coordinator` and serves its bridge in a fresh work dir; the bridge
    reaches the coordinator over its TCP API (`tcp`) or by direct calls (`in-process`)."""
    bridges: list[BridgeServer] = []

    def make(
        coordinator: Coordinator, name: str = "w1", backend: str = "tcp", **bridge_options: Any
    ) -> tuple[BridgeServer, dict[str, Any]]:
        client = CoordinatorClient(coordinator.url)
        job = json.loads(client.request_job(name))
        work_dir = short_dir / name
        work_dir.mkdir()
        reach = client.backend if backend == "tcp" else coordinator.backend
        # alpha.17's unless asked: most of these tests are about its bridge.
        generation = bridge_options.pop("generation", "alpha17")
        served = ActionBridgeServer if generation == "actions" else Alpha17BridgeServer
        bridge = served(work_dir, reach(job["job_id"]), name=f"{name} bridge", **bridge_options)
        bridge.start()
        bridges.append(bridge)
        return bridge, job

    yield make
    for bridge in bridges:
        bridge.stop()


# Test modules get the helpers through fixtures: importing from a conftest module is fragile
# when several conftest.py files share that name.


@pytest.fixture
def connect() -> Callable[[Path], UnixHTTPConnection]:
    return UnixHTTPConnection


@pytest.fixture
def receive() -> Callable[[Path, Any], tuple[int, str | None, EventStream]]:
    return open_stream
