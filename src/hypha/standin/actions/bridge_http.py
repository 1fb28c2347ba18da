"""An action-era worker's bridge routes over HTTP (docs/protocol-actions.md section 2): the
shared handler (worker/bridge_http.py) with the action protocol's send, receive and
`/action/update`; and the bridge served on its socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.protocol.actions.messages import (
    ACTION_BODY_REFERENCE,
    ACTION_RECEIVE_REQUEST,
    ACTION_REQUEST,
    ACTION_SEND_REQUEST,
)
from hypha.accelerate_executor.protocol.messages import wire
from hypha.standin.actions.bridge import ActionBridge
from hypha.standin.backend import BridgeBackend
from hypha.standin.console import say
from hypha.standin.worker.axum_body import deserialized, shaped
from hypha.standin.worker.bridge_http import BridgeHandler
from hypha.standin.worker.bridge_server import BridgeServer, WorkerSettings
from hypha.standin.worker.faults import Fault


class ActionHandler(BridgeHandler):
    routes = ("/resources/fetch", "/resources/send", "/resources/receive", "/action/update")
    fetch_reference = ACTION_BODY_REFERENCE

    @property
    def actions(self) -> ActionBridge:
        bridge = self.bridge
        assert isinstance(bridge, ActionBridge)
        return bridge

    def _route(self, path: str, raw: Any, fault: Fault | None) -> None:
        if path == "/resources/send":
            self.actions.send_now(deserialized(ACTION_SEND_REQUEST, raw))
            self._reply(200, b"", None)
        elif path == "/resources/receive":
            request = deserialized(ACTION_RECEIVE_REQUEST, raw)
            if fault is not None:
                say(self.bridge.name, f"fault on demand: {path} writes slowly")
            received = self.actions.receive_one(request, fault.seconds if fault else 0.0)
            if received is None:
                self._reply(204, b"", None)
            else:
                self._reply(200, json.dumps(received).encode(), "application/json")
        else:
            answer = self.actions.action(wire(shaped(ACTION_REQUEST, raw)))
            self._reply(200, json.dumps(answer).encode(), "application/json")


class ActionBridgeServer(BridgeServer, ActionBridge):
    """An action-era bridge served on WORK_DIR/bridge.sock from `start()` until `stop()`."""

    handler = ActionHandler
    # The later releases' runtime keeps the executor's stderr out of the worker's output
    # and reports its tail in the job's status.
    reports_job_status = True

    @classmethod
    def for_worker(
        cls, work_dir: Path, backend: BridgeBackend, settings: WorkerSettings
    ) -> ActionBridgeServer:
        return cls(
            work_dir,
            backend,
            owner=settings.owner,
            keepalive_s=settings.keepalive_s,
            name=settings.name,
            job_id=settings.job_id,
            strict_receive=settings.strict_receive,
        )
