"""The action protocol's aggregate exchange (training/actions/exchange.py) as a state machine,
in this process: a real ActionBridgeClient against a real HTTP server on a Unix socket that
plays the bridge's send and receive, pushes of the parameter server's aggregate in the
test's hands. Each aggregate is merged exactly once, whenever it comes: before the action
that asks for it, late, or without a send of ours (a round closed at a quorum)."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
from hypha.accelerate_executor.training.actions import exchange as exchange_module
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.accelerate_executor.training.actions.exchange import AggregateExchange
from hypha.accelerate_executor.training.diloco import GlobalWeights, moved_by
from hypha.accelerate_executor.training.distributed import Ranks
from unix_http import QuietHandler, serving

PS = "12D3KooWParameterServer"
TARGET = ActionPeersReference.model_validate(
    {"type": "peers", "peers": [PS], "strategy": {"type": "One"}, "resource": None}
)
SOURCE = TARGET.model_copy(update={"strategy": TARGET.strategy.model_copy(update={"type": "All"})})


class PlayedBridge:
    """The bridge's `/resources/send` (the file taken and deleted, as `remove_file` asks) and
    `/resources/receive` (held open until the test pushes a file, or 204 at its deadline)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.pushes: queue.Queue[dict[str, torch.Tensor]] = queue.Queue()
        self.sent: list[dict[str, torch.Tensor]] = []
        self.receives_opened = 0
        self.pushed = 0

    def push(self, update: dict[str, torch.Tensor]) -> None:
        self.pushes.put(update)

    def handler(self) -> type[QuietHandler]:
        bridge = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/resources/send":
                    path = bridge.work_dir / body["path"]
                    from safetensors.torch import load_file

                    bridge.sent.append(load_file(path))
                    path.unlink()
                    self.reply_json(None)
                elif self.path == "/resources/receive":
                    bridge.receives_opened += 1
                    timeout = body["timeout"]
                    deadline = timeout["secs_since_epoch"] + timeout["nanos_since_epoch"] / 1e9
                    try:
                        update = bridge.pushes.get(timeout=max(0.0, deadline - time.time()))
                    except queue.Empty:
                        self.reply(204, "application/json", b"")
                        return
                    bridge.pushed += 1
                    relative = f"{body['path']}/{PS}.safetensors"
                    (bridge.work_dir / body["path"]).mkdir(parents=True, exist_ok=True)
                    save_file(update, bridge.work_dir / relative)
                    size = (bridge.work_dir / relative).stat().st_size
                    self.reply_json({"path": relative, "size": size, "from_peer": PS})
                else:
                    self.reply_json({"error": "not_found", "detail": self.path}, 404)

        return Handler


@pytest.fixture
def played(tmp_path: Path) -> Iterator[tuple[PlayedBridge, ActionBridgeClient]]:
    bridge = PlayedBridge(tmp_path)
    with serving(tmp_path / "bridge.sock", bridge.handler()) as socket_path:
        yield bridge, ActionBridgeClient(socket_path, tmp_path, "job-1")


def exchange_on(client: ActionBridgeClient, work_dir: Path) -> tuple[AggregateExchange, list[str]]:
    said: list[str] = []
    weights = GlobalWeights({"w": torch.zeros(4), "steps": torch.zeros((), dtype=torch.int64)})
    ranks = Ranks(Accelerator(cpu=True))
    exchange = AggregateExchange(client, weights, ranks, work_dir, said.append, lambda: 1)
    return exchange, said


LOCAL = {"w": torch.ones(4), "steps": torch.tensor(3)}
UPDATE = {"w": torch.full((4,), 0.5), "steps": torch.tensor(3.0)}


def test_an_aggregate_pushed_before_apply_update_is_merged_once(played, tmp_path: Path) -> None:
    bridge, client = played
    exchange, _ = exchange_on(client, tmp_path)
    problem, size = exchange.send(LOCAL, TARGET, torch.float32, weight=1.0)
    assert problem is None and size > 0 and exchange.awaited == "due"
    assert torch.equal(bridge.sent[0]["w"], torch.ones(4))  # theta_local - theta_global
    bridge.push(UPDATE)  # the round's aggregate, before apply-update reaches us
    assert exchange.apply(SOURCE, time.time() + 10) is None
    exchange.merge_accepted(keep=False)
    exchange.applied()
    assert torch.equal(exchange.global_weights.tensors["w"], torch.full((4,), 0.5))
    assert not list((tmp_path / "incoming").glob("accepted-*"))  # read by every rank, gone
    assert int(exchange.global_weights.tensors["steps"]) == 3
    assert exchange.awaited == "none" and not exchange.arrived()
    # Nothing more comes: a second apply-update finds nothing, and merges nothing twice.
    problem = exchange.apply(SOURCE, time.time() + 0.5)
    assert problem is not None and "nothing arrived" in problem.message
    assert torch.equal(exchange.global_weights.tensors["w"], torch.full((4,), 0.5))
    assert bridge.pushed == 1


def test_an_aggregate_late_past_the_wait_is_merged_at_a_later_action(
    played, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge, client = played
    monkeypatch.setattr(exchange_module, "HELD_AGGREGATE_WAIT_S", 0.3)
    exchange, said = exchange_on(client, tmp_path)
    exchange.send(LOCAL, TARGET, torch.float32, weight=1.0)
    # The next action that trains comes before the aggregate: waited for once, then late.
    assert not exchange.apply_held(arrived=False)
    assert exchange.awaited == "late"
    assert "did not come within 0.3 s" in said[-1]
    bridge.push(UPDATE)
    deadline = time.time() + 10
    while not exchange.arrived() and time.time() < deadline:
        time.sleep(0.01)
    assert exchange.apply_held(arrived=True)
    exchange.merge_accepted(keep=True)
    exchange.applied()
    # Kept whole, for the local weights to move by it too: their drift stays on top.
    moved = moved_by({"w": torch.full((4,), 2.0), "steps": torch.tensor(5)}, exchange.last_update)
    assert torch.equal(moved["w"], torch.full((4,), 2.5)) and int(moved["steps"]) == 8
    assert exchange.awaited == "none" and bridge.pushed == 1


def test_an_aggregate_without_our_send_is_merged_and_said(played, tmp_path: Path) -> None:
    """A round closed at a quorum without our update: its aggregate still comes to the
    receive kept open since our first send, and is merged, once."""
    bridge, client = played
    exchange, said = exchange_on(client, tmp_path)
    exchange.send(LOCAL, TARGET, torch.float32, weight=1.0)
    bridge.push(UPDATE)
    assert exchange.apply(SOURCE, time.time() + 10) is None
    exchange.merge_accepted(keep=False)
    exchange.applied()
    assert not exchange.apply_held(arrived=False)  # none awaited: no look at all
    bridge.push(UPDATE)  # the next round, closed without us
    deadline = time.time() + 10
    while not exchange.arrived() and time.time() < deadline:
        time.sleep(0.01)
    assert exchange.apply_held(arrived=True)
    exchange.merge_accepted(keep=False)
    assert "came without our update" in said[-1]
    assert torch.equal(exchange.global_weights.tensors["w"], torch.ones(4))
    assert bridge.receives_opened >= 2  # kept open: a new receive after each file


def test_a_failed_send_awaits_nothing_and_leaves_no_file(tmp_path: Path) -> None:
    class Refusing(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/resources/receive":
                threading.Event().wait(5)  # held open: the standing receive's
                self.reply(204, "application/json", b"")
                return
            self.reply_json({"error": "invalid_request", "detail": "no such peer"}, 400)

    with serving(tmp_path / "bridge.sock", Refusing) as socket_path:
        exchange, _ = exchange_on(ActionBridgeClient(socket_path, tmp_path, "job-1"), tmp_path)
        problem, _ = exchange.send(LOCAL, TARGET, torch.float32, weight=1.0)
    assert problem is not None and problem.type == "connection"
    assert "sending the update failed" in problem.message
    assert exchange.awaited == "none"
    assert not list((tmp_path / "pseudo-gradients").iterdir())
