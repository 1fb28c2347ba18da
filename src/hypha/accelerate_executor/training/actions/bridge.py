"""The action protocol's routes of the Job Bridge (docs/protocol-actions.md section 2).

Beside the fetch both generations share (BridgeClient's): `POST /action/update` reports a
status and returns the next action; `POST /resources/send` returns once every target has the
bytes and always carries `remove_file`; `POST /resources/receive` waits for one file until an
absolute deadline and answers it as JSON, or 204 when none came. `standing_receive` keeps
such a receive open from the first send on (bridge/receiver.py).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from hypha.accelerate_executor.bridge.client import (
    FETCH_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    BridgeClient,
    ReceivedFile,
    json_body,
    raise_for,
    reaching,
)
from hypha.accelerate_executor.bridge.receiver import KeptOpenReceiver
from hypha.accelerate_executor.bridge.retry import RetryPolicy, retrying
from hypha.accelerate_executor.errors import BridgeAnswerError
from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
from hypha.accelerate_executor.protocol.actions.messages import (
    ACTION_ROUTE,
    Action,
    ActionReceiveRequest,
    ActionSendRequest,
    Status,
    SystemTime,
    action_request,
    parse_action_response,
)
from hypha.accelerate_executor.protocol.messages import wire
from hypha.accelerate_executor.training.actions.scheduler_clock import SchedulerClock

# Beyond a receive's deadline: how long the bridge may take to say 204, and how long its
# receive directory may go unwritten while a late push still streams in.
RECEIVE_SLACK_S = 30.0
# A 204 this long before the deadline is not the deadline's: the bridge could not register
# the receive (upstream's connector holds one registration at a time) and said so at once.
REFUSED_BEFORE_S = 1.0
# The pauses before asking again after such a 204: short, since a push that comes while no
# receive is registered is refused (upstream's own sender tries every 50 ms), growing in
# case the registration stays taken.
REFUSED_POLICY = RetryPolicy(first_pause_s=0.05, max_pause_s=1.0)
# How often a receive's wait looks at its directory once past the deadline and its slack.
ANSWER_POLL_S = 1.0
# Each receive of the standing receive: the aggregate comes once the round's slowest peer has
# sent too, which can be a whole window of training after us; an open receive costs nothing
# while it waits, and the next opens when it ends empty.
STANDING_RECEIVE_S = 3600.0
# After a receive the bridge refused for good: the longest pause before the next.
RECEIVE_AGAIN_S = 1.0


class ActionBridgeClient(BridgeClient):
    def __init__(self, socket_path: Path, work_dir: Path, job_id: str) -> None:
        super().__init__(socket_path, work_dir)
        self.job_id = job_id
        self.receive_slack_s = RECEIVE_SLACK_S
        self.scheduler_clock = SchedulerClock()

    def update(self, status: Status) -> Action:
        """Reports `status`; returns the scheduler's next action, its deadline on the worker's
        clock (scheduler_clock.py: the answer's round trip is one of its samples)."""
        sent = time.time()
        answer = self.post_json(
            ACTION_ROUTE, action_request(self.job_id, status), REQUEST_TIMEOUT_S
        )
        answered = time.time()
        action = parse_action_response(answer, self.job_id)
        return self.scheduler_clock.read(status, action, sent, answered)

    def send_file(
        self, reference: ActionPeersReference, relative_path: str, remove_file: bool
    ) -> None:
        """Sends a file to the peers and returns once they all have it; the bridge deletes
        it afterwards when `remove_file`."""
        body = ActionSendRequest(resource=reference, path=relative_path, remove_file=remove_file)
        # A model-sized file crosses the network before the answer comes. Sent again after a
        # transient failure only while the file is there: a bridge that deleted it has sent it.
        path = self.work_dir / relative_path
        self.post_json("/resources/send", wire(body), FETCH_TIMEOUT_S, may_retry=path.exists)

    def receive_one(
        self,
        reference: ActionPeersReference,
        relative_dir: str,
        deadline: float,
        sent: threading.Event | None = None,
    ) -> ReceivedFile | None:
        """Waits until `deadline` (the worker's time.time()) for one file from the peers;
        None when none came. A deadline already past is never sent: upstream's bridge takes
        it for no deadline at all and would wait for ever. `sent` is set once the request
        is on the bridge's socket, and cleared when the bridge refuses it with a 204.

        The answer is awaited past the deadline for as long as the bridge keeps writing into
        `relative_dir`: upstream's bridge stops a receive's idle timer once data flows, so a
        model of a few GB over a slow link is answered long after the deadline. A 204 well
        before the deadline (the bridge could not register the receive) is asked again
        after a pause, until the deadline."""
        if deadline <= time.time():
            return None
        route = "/resources/receive"
        request = ActionReceiveRequest(
            resource=reference, path=relative_dir, timeout=SystemTime.at(deadline)
        )
        body = json_body(wire(request))
        directory = self.work_dir / relative_dir

        def await_answer(sock: socket.socket) -> None:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            while not poller.poll(int(ANSWER_POLL_S * 1000)):
                quiet_since = time.time() - self.receive_slack_s
                if quiet_since > deadline and not written_since(directory, quiet_since):
                    raise TimeoutError

        def attempt() -> tuple[int, bytes]:
            timeout = deadline - time.time() + self.receive_slack_s
            with reaching(self.socket_path, route, timeout):
                status, data = self.round_trip(route, body, timeout, sent, await_answer)
            if status not in (200, 204):
                raise_for(route, status, data)
            return status, data

        refusals = 0
        while True:
            # Tried again on a transient failure only until the deadline: past it, upstream's
            # bridge would take the deadline for none at all.
            status, data = retrying(route, attempt, self.retry_policy, until=deadline)
            if status != 204 or deadline - time.time() < REFUSED_BEFORE_S:
                break
            if sent is not None:
                sent.clear()
            refusals += 1
            pause = REFUSED_POLICY.pause(refusals)
            if time.time() + pause >= deadline:
                return None
            time.sleep(pause)
        if status == 204:
            return None
        try:
            entry = json.loads(data)
        except ValueError:
            raise BridgeAnswerError(route, 200, "bad_answer", "the answer is not JSON") from None
        return self.received_file(entry)


def written_since(directory: Path, since: float) -> bool:
    """Whether a file in `directory` was written at or after `since` (a time.time())."""
    try:
        return any(entry.stat().st_mtime >= since for entry in directory.iterdir())
    except OSError:
        return False


def standing_receive(
    client: ActionBridgeClient, reference: ActionPeersReference, relative_dir: str
) -> KeptOpenReceiver:
    """A receive from `reference`'s peers kept open from now on (bridge/receiver.py), each
    open one waiting up to STANDING_RECEIVE_S, refusals asked again after at most
    RECEIVE_AGAIN_S; back once the first is registered."""

    def open_one(sent: threading.Event) -> list[ReceivedFile]:
        deadline = time.time() + STANDING_RECEIVE_S
        received = client.receive_one(reference, relative_dir, deadline, sent)
        return [] if received is None else [received]

    policy = replace(client.retry_policy, max_pause_s=RECEIVE_AGAIN_S)
    receiver = KeptOpenReceiver(open_one, client.socket_path, policy, name="standing-receive")
    receiver.wait_open()
    return receiver
