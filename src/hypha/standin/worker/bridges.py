"""The bridge a worker serves for each generation: the one place the worker side of the
stand-in names them (torch-free, as the worker is; generations.py names the coordinators).
Retiring alpha.17 deletes its row and import here."""

from __future__ import annotations

import json

from hypha.accelerate_executor.protocol.generation import Generation
from hypha.standin.actions.bridge_http import serve_bridge as serve_action_bridge
from hypha.standin.alpha17.bridge_http import serve_bridge as serve_alpha17_bridge
from hypha.standin.worker.bridge_server import ServeBridge

BRIDGES: dict[Generation, ServeBridge] = {
    "alpha17": serve_alpha17_bridge,
    "actions": serve_action_bridge,
}


def generation_for(job_json: str) -> Generation:
    """The bridge a job is for, as the coordinator that sent it plays: only alpha.17's
    config names where `updates` go."""
    config = json.loads(job_json)["executor"]["config"]
    return "alpha17" if "updates" in config else "actions"
