"""Each generation's coordinator: the one place the coordinator side of the stand-in names
them (worker/bridges.py names the bridges). A run's generation (RunOptions.generation)
picks its class once, and the class built plays it. Retiring alpha.17 deletes its row and
import here.
"""

from __future__ import annotations

from typing import Any

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.standin.actions.coordinator import ActionCoordinator
from hypha.standin.alpha17.coordinator import Alpha17Coordinator
from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.data_service.service import Catalog
from hypha.standin.jobs import RunOptions

COORDINATORS: dict[Generation, type[CoordinatorCore]] = {
    "alpha17": Alpha17Coordinator,
    "actions": ActionCoordinator,
}


def build_core(catalog: Catalog, options: RunOptions, **core: Any) -> CoordinatorCore:
    """The run's coordinator, for bridges in this process (InProcessBackend); `core`: its
    options (name, clock, push_destination)."""
    return COORDINATORS[options.generation](catalog, options, **core)


def job_spec(
    job_id: str, options: RunOptions, catalog: Catalog, scheduler_peer: str, parameter_server: str
) -> dict[str, Any]:
    """The job JSON for one worker, as the run's generation's scheduler sends it."""
    return COORDINATORS[options.generation].build_job(
        job_id, options, catalog, scheduler_peer, parameter_server
    )
