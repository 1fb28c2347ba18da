"""One Job Bridge served on WORK_DIR/bridge.sock: what it does (bridge_core.JobBridge and a
generation's subclass) and its HTTP face (bridge_http.py and the generation's handler) on a
Unix socket only its owner may connect to.

`BridgeServer` is mixed in before a generation's bridge (alpha17/bridge_http.py,
actions/bridge_http.py); worker/bridges.py names the one a worker serves for a job.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hypha.standin.backend import BridgeBackend
from hypha.standin.serving import AcceptLoop
from hypha.standin.worker.bridge_core import JobBridge
from hypha.standin.worker.bridge_http import BridgeHandler, UnixHTTPServer

SOCKET_NAME = "bridge.sock"


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker asks of the bridge it serves for a job; each generation's bridge takes
    of it what it has (`BridgeServer.for_worker`)."""

    owner: tuple[int, int] | None
    keepalive_s: float
    name: str
    job_id: str
    # The action protocol's: whether a push no open receive takes is refused, as upstream's.
    strict_receive: bool


class BridgeServer(JobBridge):
    """Serves one job's bridge from `start()` until `stop()`.

    `owner=(uid, gid)`: when running as root, the socket and everything the bridge writes
    are chowned to it, as if a worker running as that user had made them.
    """

    # The generation's routes.
    handler: ClassVar[type[BridgeHandler]]
    # Whether the worker of the releases that serve this bridge reports a job status
    # (job_status.py), keeping the executor's stderr out of its own output.
    reports_job_status: ClassVar[bool]

    _server: UnixHTTPServer | None = None

    @classmethod
    @abstractmethod
    def for_worker(
        cls, work_dir: Path, backend: BridgeBackend, settings: WorkerSettings
    ) -> BridgeServer:
        """The bridge a worker serves for one job in `work_dir`."""

    @property
    def socket_path(self) -> Path:
        return self.work_dir / SOCKET_NAME

    def start(self) -> None:
        server = UnixHTTPServer(str(self.socket_path), self, self.handler)
        try:
            server.server_bind()
            # Before listen() nobody can connect, so the socket is never reachable with a
            # looser mode than 0600.
            os.chmod(self.socket_path, 0o600)
            self._own(self.socket_path)
            server.server_activate()
        except OSError:
            server.server_close()
            self.socket_path.unlink(missing_ok=True)
            raise
        self._server = server
        self._accepting = AcceptLoop(server, f"{self.name}-http")
        self._accepting.start()
        super().start()

    def stop(self) -> None:
        """Ends the receive stream, closes every connection and removes the socket."""
        server = self._server
        if server is None or self._stopping.is_set():
            return
        self.end_stream()
        self._accepting.stop()
        server.cut_connections()
        server.server_close()
        self.join()
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> BridgeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
