"""Client of the worker's Job Bridge, the transport both generations share: HTTP/1.1 over the
Unix socket in WORK_DIR, kept-alive connections, JSON requests tried again on a transient
failure, the fetch of artifacts, and the probe that asks which generation the bridge serves.
Each generation's routes are its training folder's (training/alpha17/bridge.py,
training/actions/bridge.py).

Every path the bridge hands back is checked against the work dir before it is used. A bridge that cannot be reached, or that closes the update stream, raises
BridgeGoneError: the executor's cue to exit, since the worker has stopped the job. Every
request is tried again on a transient failure first, within a bound (bridge/retry.py).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hypha.accelerate_executor.bridge.http_wire import connect_unix
from hypha.accelerate_executor.bridge.paths import resolve_in_work_dir
from hypha.accelerate_executor.bridge.retry import DEFAULT_POLICY, retrying
from hypha.accelerate_executor.errors import BridgeAnswerError, BridgeGoneError
from hypha.accelerate_executor.protocol.generation import (
    PROBE_BODY,
    PROBE_ROUTE,
    Generation,
    generation_answering,
)
from hypha.accelerate_executor.protocol.job import FetchedReference
from hypha.accelerate_executor.protocol.messages import wire

REQUEST_TIMEOUT_S = 60.0
# A fetch downloads model weights: allow it time, but never forever.
FETCH_TIMEOUT_S = 3600.0
# The probe's whole budget: a bridge that does not answer it in this long answers nothing.
PROBE_TIMEOUT_S = 10.0
# A connection idle for longer is not reused (see BridgeClient._acquire); well under any
# server's idle timeout, well over a training step.
REUSE_IDLE_S = 2.0

_CONNECTION_LOST = (ConnectionError, FileNotFoundError, http.client.RemoteDisconnected)


@dataclass(frozen=True)
class BridgeFile:
    """A file the bridge placed in the work dir."""

    path: Path  # absolute, checked to lie inside the work dir
    size: int


@dataclass(frozen=True)
class ReceivedFile(BridgeFile):
    from_peer: str


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout: float) -> None:
        super().__init__("hypha", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        self.sock = connect_unix(self._socket_path, self.timeout or REQUEST_TIMEOUT_S)


def idle_connection_is_spent(sock: socket.socket) -> bool:
    """True when an idle kept-alive connection has something to read: the server closed it
    (or sent what nobody asked for), so it cannot carry another request."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def json_body(payload: Any) -> bytes:
    # allow_nan=False: the bridge refuses NaN/Infinity, better to fail here, clearly.
    return json.dumps(payload, allow_nan=False).encode()


@contextmanager
def reaching(
    socket_path: Path, during: str, timeout: float, streaming: bool = False
) -> Iterator[None]:
    """Turns every way of losing the bridge during a request (or the update stream) into
    one BridgeGoneError."""
    try:
        yield
    except FileNotFoundError:
        raise BridgeGoneError(f"the bridge socket {socket_path} does not exist") from None
    except ConnectionRefusedError:
        raise BridgeGoneError(
            f"the bridge at {socket_path} refused the connection", transient=True
        ) from None
    except TimeoutError:
        silence = (
            f"sent nothing on {during} for" if streaming else f"did not answer {during} within"
        )
        raise BridgeGoneError(f"the bridge {silence} {timeout:.0f} s", transient=True) from None
    except _CONNECTION_LOST as exc:
        raise BridgeGoneError(f"lost the bridge during {during}: {exc}", transient=True) from None


def raise_for(route: str, status: int, data: bytes) -> NoReturn:
    """BridgeAnswerError for an answer that is not a 200, with the bridge's own words."""
    text = data.decode("utf-8", "replace").strip()
    try:
        answer = json.loads(text)
        error, detail = str(answer["error"]), str(answer.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        error, detail = "http_error", text  # 413/415/422 answers are plain text
    raise BridgeAnswerError(route, status, error, " ".join(detail.split()))


def probe_generation(socket_path: Path) -> Generation | None:
    """Which generation the bridge serves, asked without side effects (protocol/generation.py);
    None when the answer names neither, or the bridge cannot be reached."""
    connection = UnixHTTPConnection(socket_path, PROBE_TIMEOUT_S)
    try:
        connection.request(
            "POST", PROBE_ROUTE, body=PROBE_BODY, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    return generation_answering(response.status)


class BridgeClient:
    def __init__(self, socket_path: Path, work_dir: Path) -> None:
        self.socket_path = socket_path
        self.work_dir = work_dir
        self._idle: list[tuple[UnixHTTPConnection, float]] = []  # with when it went idle
        self._idle_lock = threading.Lock()
        self.retry_policy = DEFAULT_POLICY

    def fetch(self, reference: FetchedReference) -> list[BridgeFile]:
        """Asks the bridge to place the referenced files under artifacts/; returns them."""
        answer = self.post_json("/resources/fetch", wire(reference), FETCH_TIMEOUT_S)
        if not isinstance(answer, list):
            raise BridgeAnswerError(
                "/resources/fetch", 200, "bad_answer", "expected a list of files"
            )
        return [self._file(entry) for entry in answer]

    def _file(self, entry: Any) -> BridgeFile:
        path, size = self._checked_entry(entry)
        return BridgeFile(path, size)

    def received_file(self, entry: Any) -> ReceivedFile:
        path, size = self._checked_entry(entry)
        return ReceivedFile(path, size, str(entry.get("from_peer", "")))

    def _checked_entry(self, entry: Any) -> tuple[Path, int]:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise BridgeAnswerError("bridge", 200, "bad_answer", f"not a file entry: {entry!r}")
        return resolve_in_work_dir(self.work_dir, entry["path"]), int(entry.get("size", 0))

    def post_json(
        self,
        route: str,
        payload: Any,
        timeout: float,
        may_retry: Callable[[], bool] = lambda: True,
    ) -> Any:
        """The request, tried again on a transient failure (bridge/retry.py); its answer's
        JSON."""
        body = json_body(payload)

        def attempt() -> tuple[int, bytes]:
            with reaching(self.socket_path, route, timeout):
                status, data = self.round_trip(route, body, timeout)
            if status != 200:
                raise_for(route, status, data)
            return status, data

        _, data = retrying(route, attempt, self.retry_policy, may_retry=may_retry)
        return json.loads(data) if data.strip() else None

    def round_trip(
        self,
        route: str,
        body: bytes,
        timeout: float,
        sent: threading.Event | None = None,
        await_answer: Callable[[socket.socket], None] | None = None,
    ) -> tuple[int, bytes]:
        """One request on a kept-alive connection: a `status` goes out after every batch,
        and a new connection each time costs the bridge more than answering it. Hand-written
        on http.client: the executor image has no urllib3 (nor requests, nor httpx). `sent`
        is set once the request is on the socket, before its answer is awaited;
        `await_answer`, given the socket, returns once the answer has begun to come (or
        raises TimeoutError), in place of the socket's timeout."""
        connection, reused = self._acquire(timeout)
        headers = {"Content-Type": "application/json"}
        try:
            try:
                connection.request("POST", route, body=body, headers=headers)
            except _CONNECTION_LOST:
                if not reused:
                    raise
                # The bridge closed the idle connection just before this request went out (a
                # Unix socket refuses the write at once), so it never read it: sent again,
                # once, on a new connection. Never after the request went out: a `send` or a
                # `status` the bridge may have acted on must not reach it twice.
                connection.close()
                connection = UnixHTTPConnection(self.socket_path, timeout)
                connection.request("POST", route, body=body, headers=headers)
            if sent is not None:
                sent.set()
            if await_answer is not None and connection.sock is not None:
                await_answer(connection.sock)
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            connection.close()
            raise
        # http.client drops the socket itself when the bridge said it would close.
        if connection.sock is not None:
            with self._idle_lock:
                self._idle.append((connection, time.monotonic()))
        return response.status, data

    def _acquire(self, timeout: float) -> tuple[UnixHTTPConnection, bool]:
        """A recently used connection the bridge has not closed, or a new one; and which it is.

        Only recent ones: a server closes connections that have been idle for a while, and
        one closing just as a request arrives leaves it unknown whether the request was acted
        on, so it could not be sent again. Statuses come every step; rounds are far apart."""
        while True:
            with self._idle_lock:
                connection, idle_since = self._idle.pop() if self._idle else (None, 0.0)
            if connection is None:
                return UnixHTTPConnection(self.socket_path, timeout), False
            recent = time.monotonic() - idle_since < REUSE_IDLE_S
            if (
                recent
                and connection.sock is not None
                and not idle_connection_is_spent(connection.sock)
            ):
                connection.sock.settimeout(timeout)
                return connection, True
            connection.close()

    @staticmethod
    def exchange(
        connection: UnixHTTPConnection, route: str, body: bytes
    ) -> http.client.HTTPResponse:
        connection.request("POST", route, body=body, headers={"Content-Type": "application/json"})
        return connection.getresponse()
