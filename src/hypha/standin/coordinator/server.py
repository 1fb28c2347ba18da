"""The local cluster's coordinator as a process runs it: what it does
(core.CoordinatorCore) served over TCP by its HTTP face (http_api.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from hypha.standin.coordinator.core import CoordinatorCore, InProcessBackend
from hypha.standin.coordinator.http_api import CoordinatorServer
from hypha.standin.data_service.service import Catalog
from hypha.standin.jobs import RunOptions

__all__ = ["Catalog", "Coordinator", "InProcessBackend", "RunOptions"]

# At stop, how long an average in progress may take to finish (a tiny model's takes
# milliseconds; a large one's seconds).
STOP_AVERAGE_S = 60.0


class Coordinator(CoordinatorCore):
    """Serves the coordinator's API on `host:port` (0: any free port) from `start()` until
    `stop()`."""

    def __init__(
        self,
        catalog: Catalog,
        options: RunOptions,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "coordinator",
        clock: Callable[[], float] = time.monotonic,
        push_destination: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(
            catalog, options, name=name, clock=clock, push_destination=push_destination
        )
        self._server = CoordinatorServer((host, port), self)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
        self.aggregation.join(STOP_AVERAGE_S)

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
