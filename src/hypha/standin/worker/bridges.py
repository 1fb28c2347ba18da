"""The bridge a worker serves for each generation: the one place the worker side of the
stand-in names them (torch-free, as the worker is; generations.py names the coordinators).
Retiring alpha.17 deletes its row and import here."""

from __future__ import annotations

import json

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.standin.actions.bridge_http import ActionBridgeServer
from hypha.standin.alpha17.bridge_http import Alpha17BridgeServer
from hypha.standin.worker.bridge_server import BridgeServer

BRIDGES: dict[Generation, type[BridgeServer]] = {
    "alpha17": Alpha17BridgeServer,
    "actions": ActionBridgeServer,
}


def generation_for(job_json: str) -> Generation:
    """The bridge a job is for, as the coordinator that sent it plays: only alpha.17's
    config names where `updates` go."""
    config = json.loads(job_json)["executor"]["config"]
    return "alpha17" if "updates" in config else "actions"
