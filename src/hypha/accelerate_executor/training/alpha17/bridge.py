"""alpha.17's routes of the Job Bridge (docs/protocol.md): `/resources/send` hands a file over
and returns before it is sent, `/status/send` carries a progress message and returns the
scheduler's answer, and `/resources/receive` opens the job's one receive stream (server-sent
events, a file each), which `update_inbox` holds open from start to end (bridge/receiver.py).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator

from hypha.accelerate_executor.bridge.client import (
    REQUEST_TIMEOUT_S,
    BridgeClient,
    ReceivedFile,
    UnixHTTPConnection,
    json_body,
    raise_for,
    reaching,
)
from hypha.accelerate_executor.bridge.receiver import KeptOpenReceiver
from hypha.accelerate_executor.bridge.retry import retrying
from hypha.accelerate_executor.errors import BridgeGoneError
from hypha.accelerate_executor.protocol.alpha17.job import PeersReference
from hypha.accelerate_executor.protocol.alpha17.messages import (
    PROGRESS,
    STATUS_ROUTE,
    Progress,
    ReceiveRequest,
    SchedulerAnswer,
    SendRequest,
    parse_answer,
)
from hypha.accelerate_executor.protocol.messages import wire

# The bridge writes `: keepalive` every 5 s; three missed in a row means it is gone.
STREAM_SILENCE_LIMIT_S = 15.0


class Alpha17Bridge(BridgeClient):
    def send(self, reference: PeersReference, relative_path: str) -> None:
        """Hands a file to the bridge for the peers. It is sent after this returns:
        the caller must not touch the file again."""
        body = SendRequest(resource=reference, path=relative_path)
        self.post_json("/resources/send", wire(body), REQUEST_TIMEOUT_S)

    def status(self, progress: Progress) -> SchedulerAnswer:
        """Sends a Progress message; returns the scheduler's answer. (The statuses of the
        batches go out through status_reporter.StatusReporter, which does not wait for answers.)"""
        body = PROGRESS.dump_python(progress)
        return parse_answer(self.post_json(STATUS_ROUTE, body, REQUEST_TIMEOUT_S))

    def receive(
        self, reference: PeersReference, relative_dir: str = "incoming"
    ) -> Iterator[ReceivedFile]:
        """Opens the job's one receive stream now; the iterator yields each file a peer pushes.

        The stream is meant to stay open for the whole job: it ending, or falling silent
        for longer than the keepalive period allows, raises BridgeGoneError.
        """
        route = "/resources/receive"
        body = json_body(wire(ReceiveRequest(resource=reference, path=relative_dir)))

        def attempt() -> tuple[UnixHTTPConnection, http.client.HTTPResponse]:
            connection = UnixHTTPConnection(self.socket_path, STREAM_SILENCE_LIMIT_S)
            try:
                with reaching(self.socket_path, route, STREAM_SILENCE_LIMIT_S):
                    response = self.exchange(connection, route, body)
                    if response.status != 200:
                        raise_for(route, response.status, response.read())
            except BaseException:
                connection.close()
                raise
            return connection, response

        return self._events(*retrying(route, attempt, self.retry_policy))

    def _events(
        self, connection: UnixHTTPConnection, response: http.client.HTTPResponse
    ) -> Iterator[ReceivedFile]:
        try:
            with reaching(
                self.socket_path, "the update stream", STREAM_SILENCE_LIMIT_S, streaming=True
            ):
                data_lines: list[str] = []
                while True:
                    raw = response.readline()
                    if not raw:
                        raise BridgeGoneError("the bridge closed the update stream")
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line.startswith("data:"):
                        data_lines.append(line[5:].removeprefix(" "))
                    elif not line and data_lines:
                        yield self.received_file(json.loads("\n".join(data_lines)))
                        data_lines = []
                    # Comments (`: keepalive`) and other SSE fields carry nothing for us.
        finally:
            connection.close()


def update_inbox(bridge: Alpha17Bridge, results: PeersReference) -> KeptOpenReceiver:
    """alpha.17's one receive stream, held open from now on (bridge/receiver.py): the files
    the parameter server pushes, from `results`' peers (any peer when it names none). Back
    once the stream is open, before anything is sent. A push that comes while no stream is
    open is not announced; upstream's connector frees a receive's registration once its
    stream is dropped (libp2p-stream's `accept` skips closed senders, docs/faults.md), so a
    reopen that comes too early gets a stream that ends at once and is opened again."""
    accepted = set(results.peers)

    def open_stream(sent: threading.Event) -> Iterator[ReceivedFile]:
        stream = bridge.receive(results)
        sent.set()  # the bridge answered 200: the stream is registered
        return stream

    inbox = KeptOpenReceiver(
        open_stream,
        bridge.socket_path,
        bridge.retry_policy,
        accept=lambda received: not accepted or received.from_peer in accepted,
        # The next update comes only after this one is merged and reported: the bridge's
        # overwriting it then is what keeps the work dir at one update's size.
        move_aside=False,
    )
    inbox.wait_open()
    return inbox
