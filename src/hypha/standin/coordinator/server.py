"""The local cluster's coordinator as a process runs it: what it does (core.CoordinatorCore,
and a generation's subclass of it) served over TCP by its HTTP face (http_api.py).

`build_coordinator` builds the one a run plays: `Coordinator` mixed in before the
generation's coordinator class (generations.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any, cast

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.coordinator.http_api import CoordinatorServer
from hypha.standin.coordinator.in_process import InProcessBackend
from hypha.standin.data_service.service import Catalog
from hypha.standin.generations import COORDINATORS
from hypha.standin.jobs import RunOptions

__all__ = [
    "Catalog",
    "Coordinator",
    "InProcessBackend",
    "RunOptions",
    "build_coordinator",
    "coordinator_class",
]

# At stop, how long an average in progress may take to finish (a tiny model's takes
# milliseconds; a large one's seconds).
STOP_AVERAGE_S = 60.0


class Coordinator(CoordinatorCore):
    """Serves the coordinator's API on `host:port` (0: any free port) from `start()` until
    `stop()`. `core`: the generation's coordinator's own options (name, clock, ...)."""

    def __init__(
        self,
        catalog: Catalog,
        options: RunOptions,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        **core: Any,
    ) -> None:
        super().__init__(catalog, options, **core)
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


def build_coordinator(catalog: Catalog, options: RunOptions, **served: Any) -> Coordinator:
    """The run's coordinator, its API on TCP from `start()`: `served`, host and port and the
    generation's coordinator's own options (name, clock, push_destination)."""
    return coordinator_class(options.generation)(catalog, options, **served)


@cache
def coordinator_class(generation: Generation) -> type[Coordinator]:
    """The generation's coordinator class with the TCP face mixed in, made once: so that a
    generation needs no served class of its own, and retiring one leaves none behind."""
    core = COORDINATORS[generation]
    return cast(type[Coordinator], type(f"Served{core.__name__}", (Coordinator, core), {}))
