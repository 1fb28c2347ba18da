"""Each generation's coordinator: the one place the coordinator side of the stand-in names
them (worker/bridges.py names the bridges). A run's generation (RunOptions.generation)
picks its row once, and the class built plays it. Retiring alpha.17 deletes its row and
import here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.standin.actions import coordinator as actions
from hypha.standin.alpha17 import coordinator as alpha17
from hypha.standin.coordinator.core import CoordinatorCore
from hypha.standin.data_service.service import Catalog
from hypha.standin.jobs import RunOptions

JobSpec = Callable[[str, RunOptions, Catalog, str, str], dict[str, Any]]


class Played(NamedTuple):
    """A generation's coordinator class, and the job spec its scheduler sends."""

    core: type[CoordinatorCore]
    job_spec: JobSpec


PLAYED: dict[Generation, Played] = {
    "alpha17": Played(alpha17.Alpha17Coordinator, alpha17.job_spec),
    "actions": Played(actions.ActionCoordinator, actions.job_spec),
}


def build_core(catalog: Catalog, options: RunOptions, **core: Any) -> CoordinatorCore:
    """The run's coordinator, for bridges in this process (InProcessBackend); `core`: its
    options (name, clock, push_destination)."""
    return PLAYED[options.generation].core(catalog, options, **core)


def job_spec(
    job_id: str, options: RunOptions, catalog: Catalog, scheduler_peer: str, parameter_server: str
) -> dict[str, Any]:
    """The job JSON for one worker, as the run's generation's scheduler sends it."""
    return PLAYED[options.generation].job_spec(
        job_id, options, catalog, scheduler_peer, parameter_server
    )
