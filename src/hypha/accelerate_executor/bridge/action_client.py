"""The Job Bridge as action-era workers serve it (docs/protocol-actions.md section 2), and the
probe that tells the two generations apart.

Beside alpha.17's fetch (unchanged, BridgeClient's): `POST /action/update` reports a status
and returns the next action; `POST /resources/send` returns once every target has the bytes
and always carries `remove_file`; `POST /resources/receive` waits for one file until an
absolute deadline and answers it as JSON, or 204 when none came. A `StandingReceive` keeps
such a receive open on a thread of its own, one after the other, its files queued.
"""

from __future__ import annotations

import http.client
import json
import queue
import select
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from hypha.accelerate_executor.bridge.actions import (
    Action,
    Status,
    action_request,
    parse_action_response,
)
from hypha.accelerate_executor.bridge.bodies import (
    ActionReceiveRequest,
    ActionSendRequest,
    SystemTime,
    wire,
)
from hypha.accelerate_executor.bridge.client import (
    FETCH_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    BridgeClient,
    ReceivedFile,
    _UnixHTTPConnection,
    json_body,
    raise_for,
    reaching,
)
from hypha.accelerate_executor.bridge.retry import RetryPolicy, retrying
from hypha.accelerate_executor.bridge.scheduler_clock import SchedulerClock
from hypha.accelerate_executor.errors import BridgeError
from hypha.accelerate_executor.spec.job import ActionPeersReference, Generation

ACTION_ROUTE = "/action/update"
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
# The probe's whole budget: a bridge that does not answer it in this long answers nothing.
PROBE_TIMEOUT_S = 10.0
# How long a standing receive may take to put its request on the bridge's socket.
SENT_WAIT_S = 10.0
# A request on the socket that no 204 has answered within this long counts as registered:
# a bridge that cannot register a receive says so at once.
REGISTERED_AFTER_S = 0.05
# Each receive of a StandingReceive: the aggregate comes once the round's slowest peer has
# sent too, which can be a whole window of training after us; an open receive costs nothing
# while it waits, and the next opens when it ends empty.
STANDING_RECEIVE_S = 3600.0
# After a receive the bridge refused for good: the pause before the next.
RECEIVE_AGAIN_S = 1.0


def probe_generation(socket_path: Path) -> Generation | None:
    """Which generation the bridge serves, asked without side effects: `POST /action/update`
    with `{}`, a body no bridge accepts, so nothing reaches a scheduler. An action-era bridge
    refuses it (422, its JSON extractor), an alpha.17 one has no such route (404). None when
    the answer says neither, or the bridge cannot be reached."""
    connection = _UnixHTTPConnection(socket_path, PROBE_TIMEOUT_S)
    try:
        connection.request(
            "POST", ACTION_ROUTE, body=b"{}", headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    return {422: "actions", 404: "alpha17"}.get(response.status)  # type: ignore[return-value]


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
        answer = self._post_json(
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
        self._post_json("/resources/send", wire(body), FETCH_TIMEOUT_S, may_retry=path.exists)

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
                status, data = self._round_trip(route, body, timeout, sent, await_answer)
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
            raise BridgeError(route, 200, "bad_answer", "the answer is not JSON") from None
        return self._received(entry)


def written_since(directory: Path, since: float) -> bool:
    """Whether a file in `directory` was written at or after `since` (a time.time())."""
    try:
        return any(entry.stat().st_mtime >= since for entry in directory.iterdir())
    except OSError:
        return False


class StandingReceive:
    """A receive from `reference`'s peers kept open on a daemon thread: each file it gets is
    moved aside (the bridge writes the next push from the same peer to the same path) and
    queued, and the next receive opens at once. Upstream's worker refuses a push that comes
    while no receive is open, and a parameter server pushes when it has aggregated, which
    may be before the action that wants the file, or while we still train (docs/protocol-
    actions.md, the action loop). Files are taken, oldest first, with `take`. Daemon: a job
    that ends while it waits leaves without joining it (entry.exit_without_teardown)."""

    def __init__(
        self, client: ActionBridgeClient, reference: ActionPeersReference, relative_dir: str
    ) -> None:
        self.reference = reference
        self._files: queue.Queue[ReceivedFile] = queue.Queue()
        self._ended: Exception | None = None  # what ended the loop (the bridge gone, ...)
        self._failed: BridgeError | None = None  # the last refusal since a receive ended well
        self._sent = threading.Event()
        self._thread = threading.Thread(
            target=self._keep_open,
            args=(client, relative_dir),
            name="standing-receive",
            daemon=True,
        )
        self._thread.start()
        self.wait_open()

    def wait_open(self) -> None:
        """Back once a receive is registered: its request on the bridge's socket and not
        refused at once (REGISTERED_AFTER_S). The caller sends next what makes the push
        come, and a thread not yet scheduled (seen on a loaded machine), or a receive the
        bridge refused, had nothing open when the push came. Bounded: a bridge that never
        takes the request leaves `take` waiting until its deadline."""
        give_up = time.monotonic() + SENT_WAIT_S
        while self._thread.is_alive() and time.monotonic() < give_up:
            if self._sent.wait(0.05):
                time.sleep(REGISTERED_AFTER_S)
                if self._sent.is_set():
                    return

    def _keep_open(self, client: ActionBridgeClient, relative_dir: str) -> None:
        taken = 0
        try:
            while True:
                deadline = time.time() + STANDING_RECEIVE_S
                try:
                    received = client.receive_one(
                        self.reference, relative_dir, deadline, self._sent
                    )
                except BridgeError as exc:
                    self._sent.clear()
                    self._failed = exc
                    time.sleep(RECEIVE_AGAIN_S)  # tried again already (retry.py); and again
                    continue
                self._sent.clear()  # answered: the next one opens now
                self._failed = None
                if received is None:
                    continue  # its deadline passed with nothing: open the next
                taken += 1
                aside = received.path.with_name(f"{received.path.name}.{taken}")
                received.path.rename(aside)
                self._files.put(replace(received, path=aside))
        except Exception as exc:  # raised again by `take` once the files before it are taken
            self._ended = exc

    def take(self, deadline: float) -> ReceivedFile | None:
        """The oldest file received and not yet taken, waiting for one until `deadline`
        (seconds since the epoch); None when none came, or the bridge's last refusal when
        its receives were refused since. Once the loop has ended, what ended it is raised
        when no file is left."""
        while True:
            try:
                return self._files.get(timeout=min(0.5, max(0.0, deadline - time.time())))
            except queue.Empty:
                if self._ended is not None and self._files.empty():
                    raise self._ended from None
                if time.time() >= deadline:
                    if self._failed is not None:
                        raise self._failed from None
                    return None

    def holds_file(self) -> bool:
        """A file has come that is not taken yet."""
        return not self._files.empty()
