"""One Job Bridge: HTTP/1.1 on the Unix socket WORK_DIR/bridge.sock, as a Hypha worker serves it.

It follows protocol.md sections 2 and 7, sharp edges included: plain-text 413/415/400/422
rejections, one receive stream per job, `send` answered before the copy, pushes written
to `<path>/<peer-id>` and announced only on an open stream. What lies beyond the bridge
(scheduler, data, models, peers) is a `BridgeBackend`; the local cluster's reaches the
coordinator over TCP (coordinator_client.py), or by direct calls when the coordinator runs
in the same process (coordinator.InProcessBackend).
"""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import socketserver
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Literal, Protocol, get_args
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from hypha.accelerate_executor.local import wire
from hypha.accelerate_executor.local.output import warn

MAX_BODY_BYTES = 2 * 1024 * 1024
# A refused body up to this size is read and dropped; a larger one costs the connection.
DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
SOCKET_NAME = "bridge.sock"
DEFAULT_RECEIVE_DIR = "incoming"
# How long one poll for pushes waits; bounds how long stop() waits for the poller.
PUSH_POLL_S = 0.2

ErrorKind = Literal["network_error", "connector_error", "io_error"]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


class BackendError(Exception):
    """A failure beyond the bridge; the bridge answers it with 500 and this kind."""

    def __init__(self, kind: ErrorKind, detail: str) -> None:
        super().__init__(detail)
        self.kind: ErrorKind = kind
        self.detail = detail


@dataclass(frozen=True)
class RemoteFile:
    """One file a fetch yields: its name under artifacts/ and the backend's handle to it."""

    name: str
    blob: str


@dataclass(frozen=True)
class Push:
    """A file a peer pushed to this job; `seq` orders the pushes of one job."""

    seq: int
    from_peer: str
    data: bytes


class BridgeBackend(Protocol):
    def fetch(self, reference: dict[str, Any]) -> list[RemoteFile]: ...

    def download(self, blob: str, out: BinaryIO) -> None: ...

    def send(self, peer: str, data: bytes) -> None: ...

    def status(self, progress: Any) -> dict[str, Any]: ...

    def next_push(self, after: int, wait_s: float) -> Push | None:
        """The first push with seq > after, waiting up to wait_s; None if there is none yet."""
        ...


class Rejection(Exception):
    """A request refused before or at its route: status, body and its content type."""

    def __init__(
        self, status: int, body: str, content_type: str = "text/plain; charset=utf-8"
    ) -> None:
        super().__init__(body)
        self.status = status
        self.body = body.encode()
        self.content_type = content_type


def invalid_request(detail: str) -> Rejection:
    return Rejection(
        400, json.dumps({"error": "invalid_request", "detail": detail}), "application/json"
    )


def server_error(kind: ErrorKind, detail: str) -> Rejection:
    return Rejection(500, json.dumps({"error": kind, "detail": detail}), "application/json")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


class BridgeServer:
    """Serves one job's bridge until `stop()`.

    `owner=(uid, gid)`: when running as root, the socket and everything the bridge writes
    are chowned to it, as if a worker running as that user had made them.
    """

    def __init__(
        self,
        work_dir: Path,
        backend: BridgeBackend,
        *,
        owner: tuple[int, int] | None = None,
        keepalive_s: float = 5.0,
        name: str = "bridge",
    ) -> None:
        self.work_dir = Path(work_dir)
        self.socket_path = self.work_dir / SOCKET_NAME
        self.backend = backend
        self.owner = owner if owner is not None and os.geteuid() == 0 else None
        self.keepalive_s = keepalive_s
        self.name = name
        self._real_work_dir = Path(os.path.realpath(self.work_dir))
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Receive state: one stream per job, ever.
        self._stream_registered = False
        self._stream: queue.Queue[dict[str, Any] | None] | None = None
        self._stream_peers: list[str] = []
        self._receive_dir = DEFAULT_RECEIVE_DIR
        self._stream_ended = threading.Event()
        self._stream_ended.set()
        self._senders: list[threading.Thread] = []
        self._server: _UnixHTTPServer | None = None

    # Life cycle.

    def start(self) -> None:
        server = _UnixHTTPServer(str(self.socket_path), self)
        try:
            server.server_bind()
            # Before listen() nobody can connect, so the socket is never reachable with a
            # looser mode than 0600.
            os.chmod(self.socket_path, 0o600)
            self._own(self.socket_path)
            server.server_activate()
        except OSError:
            server.server_close()
            self.socket_path.unlink(missing_ok=True)
            raise
        self._server = server
        self._accepting = AcceptLoop(server, f"{self.name}-http")
        self._accepting.start()
        self._poller = threading.Thread(
            target=self._poll_pushes, name=f"{self.name}-pushes", daemon=True
        )
        self._poller.start()

    def stop(self) -> None:
        """Ends the receive stream, closes every connection and removes the socket."""
        server = self._server
        if server is None or self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            if self._stream is not None:
                self._stream.put(None)
        # Lets the stream write its last chunk before its connection is cut.
        self._stream_ended.wait(2.0)
        self._accepting.stop()
        server.cut_connections()
        server.server_close()
        for thread in [self._poller, *self._senders]:
            thread.join(10.0)
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> BridgeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, text: str) -> None:
        warn(self.name, text)

    # What each route does; the handler parses the request and writes the answer.

    def fetch(self, reference: Any) -> list[dict[str, Any]]:
        if isinstance(reference, wire.PeersReference):
            raise invalid_request(
                "fetch takes a uri, huggingface or scheduler reference, not peers"
            )
        if isinstance(reference, wire.UriReference):
            url = urlsplit(reference.value)
            if url.scheme not in ("http", "https"):
                raise invalid_request("uri references must be http:// or https:// URLs")
            if url.path.rsplit("/", 1)[-1] in ("", ".", ".."):
                raise invalid_request("the URL has no file name in its last path segment")
        if isinstance(reference, wire.HuggingFaceReference):
            if not reference.repository:
                raise invalid_request("huggingface reference has an empty repository")
            if not reference.filenames:
                raise invalid_request("huggingface reference has no filenames")
            for filename in reference.filenames:
                self._relative(filename)
        try:
            files = self.backend.fetch(reference.model_dump(mode="json"))
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None
        fetched = []
        for remote in files:
            target = self._relative(f"artifacts/{remote.name}")
            size = self._write(target, partial(self.backend.download, remote.blob))
            fetched.append(
                {"path": target.relative_to(self._real_work_dir).as_posix(), "size": size}
            )
        return fetched

    def send(self, request: wire.SendRequest) -> None:
        resource = request.resource
        if not isinstance(resource, wire.PeersReference):
            raise invalid_request("send takes a peers reference")
        if not resource.peers:
            raise invalid_request("send needs at least one peer")
        path = self._relative(request.path)
        try:
            source = path.open("rb")
        except OSError as exc:
            raise server_error("io_error", f"cannot read {request.path}: {exc.strerror}") from None
        if resource.strategy.type == "All":
            targets = list(resource.peers)
        elif resource.strategy.type == "One":
            targets = resource.peers[:1]
        else:
            targets = [random.choice(resource.peers)]
        sender = threading.Thread(
            target=self._send_in_background, args=(source, request.path, targets), daemon=True
        )
        self._senders.append(sender)
        sender.start()

    def open_stream(
        self, request: wire.ReceiveRequest
    ) -> queue.Queue[dict[str, Any] | None] | None:
        """Registers the job's one receive stream; None when one was registered before."""
        resource = request.resource
        if not isinstance(resource, wire.PeersReference):
            raise invalid_request("receive takes a peers reference")
        if resource.strategy.type != "All":
            raise invalid_request(f"receive needs strategy All, not {resource.strategy.type}")
        directory = self._relative(request.path)
        with self._lock:
            if self._stream_registered or self._stopping.is_set():
                return None
            self._stream_registered = True
            self._stream = queue.Queue()
            self._stream_peers = list(resource.peers)
            self._receive_dir = directory.relative_to(self._real_work_dir).as_posix()
            self._stream_ended.clear()
            return self._stream

    def close_stream(self) -> None:
        with self._lock:
            self._stream = None
        self._stream_ended.set()

    def status(self, progress: Any) -> dict[str, Any]:
        try:
            return self.backend.status(wire.PROGRESS.dump_python(progress, mode="json"))
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None

    # Paths and files.

    def _relative(self, rel: str) -> Path:
        """The real path of `rel` under the work dir, or a 400 naming why it is refused."""
        if not rel:
            raise invalid_request("path is empty")
        pure = PurePosixPath(rel)
        if pure.is_absolute():
            raise invalid_request(f"path {rel!r} is absolute; paths are relative to the work dir")
        if ".." in pure.parts:
            raise invalid_request(f"path {rel!r} has a '..' component")
        real = Path(os.path.realpath(self._real_work_dir / pure))
        if real != self._real_work_dir and not real.is_relative_to(self._real_work_dir):
            raise invalid_request(f"path {rel!r} leads out of the work dir through a symlink")
        return real

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner)

    def _make_dirs(self, directory: Path) -> None:
        missing = []
        while not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for path in reversed(missing):
            path.mkdir(exist_ok=True)
            self._own(path)

    def _write(self, target: Path, produce: Callable[[BinaryIO], None]) -> int:
        """Writes a file 0600 (owned by `owner`) through a temporary name; returns its size."""
        try:
            self._make_dirs(target.parent)
            # The directory may have been swapped for a symlink since the path was checked.
            parent = Path(os.path.realpath(target.parent))
            if not parent.is_relative_to(self._real_work_dir):
                raise invalid_request(
                    f"{target.parent} leads out of the work dir through a symlink"
                )
            fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    produce(out)
                    size = out.tell()
                os.chmod(temporary, 0o600)
                self._own(Path(temporary))
                os.replace(temporary, parent / target.name)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except BackendError as exc:
            raise server_error(exc.kind, exc.detail) from None
        except OSError as exc:
            raise server_error(
                "io_error", f"cannot write {target.name}: {exc.strerror or exc}"
            ) from None
        return size

    # Background work.

    def _send_in_background(self, source: BinaryIO, rel: str, peers: list[str]) -> None:
        try:
            with source:
                data = source.read()
            for peer in peers:
                self.backend.send(peer, data)
        except (OSError, BackendError) as exc:
            # The request was answered already: like the real worker, all we can do is log.
            self.log(f"sending {rel} failed: {exc}")

    def _poll_pushes(self) -> None:
        seq = 0
        failing = False
        while not self._stopping.is_set():
            try:
                push = self.backend.next_push(seq, wait_s=PUSH_POLL_S)
            except BackendError as exc:
                if not failing:
                    self.log(f"cannot reach the peers: {exc.detail}; retrying")
                failing = True
                self._stopping.wait(1.0)
                continue
            failing = False
            if push is not None:
                seq = push.seq
                self._deliver(push)

    def _deliver(self, push: Push) -> None:
        if push.from_peer in ("", ".", "..") or "/" in push.from_peer:
            self.log(f"dropped a push from an unusable peer id {push.from_peer!r}")
            return
        with self._lock:
            rel = f"{self._receive_dir}/{push.from_peer}"

        def produce(out: BinaryIO) -> None:
            out.write(push.data)

        try:
            size = self._write(self._relative(rel), produce)
        except Rejection as exc:
            self.log(f"could not store the push from {push.from_peer}: {exc.body.decode()}")
            return
        with self._lock:
            stream, peers = self._stream, self._stream_peers
        if stream is not None and (not peers or push.from_peer in peers):
            stream.put({"path": rel, "size": size, "from_peer": push.from_peer})


class TracksConnections(socketserver.BaseServer):
    """Mixed into a threading socketserver: remembers the connections it has open, because
    stopping a server stops only its accept loop, and kept-alive connections would go on
    being served until cut."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self._open_lock:
            self._open.add(connection)
        return connection, address

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def cut_connections(self) -> None:
        """Shuts every open connection down, so that its clients see the server go away."""
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class AcceptLoop:
    """Serves a threading socketserver from a blocking accept() until stop().

    serve_forever wakes up every poll interval to look for a shutdown request: twenty
    times a second it cost each idle server about 2 ms of CPU a second, on the cores the
    executor trains on. Here stop() shuts the listening socket, which ends the accept.
    """

    def __init__(self, server: socketserver.TCPServer, name: str) -> None:
        self._server = server
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting; the connections already open are the caller's to cut."""
        self._stopping.set()
        with suppress(OSError):
            self._server.socket.shutdown(socket.SHUT_RDWR)
        if self._thread.ident is not None:
            self._thread.join()

    def _accept(self) -> None:
        server = self._server
        while not self._stopping.is_set():
            try:
                request, address = server.get_request()
            except OSError:
                continue  # a client that left before accept(), or stop()
            try:
                server.process_request(request, address)
            except Exception:
                server.handle_error(request, address)
                server.shutdown_request(request)


class _UnixHTTPServer(
    TracksConnections, socketserver.ThreadingMixIn, socketserver.UnixStreamServer
):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, bridge: BridgeServer) -> None:
        super().__init__(path, _Handler, bind_and_activate=False)
        self.bridge = bridge

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback; a client that hung up is normal, the rest is one line.
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            self.bridge.log(f"request failed: {error!r}")


_SEND: TypeAdapter[wire.SendRequest] = TypeAdapter(wire.SendRequest)
_RECEIVE: TypeAdapter[wire.ReceiveRequest] = TypeAdapter(wire.ReceiveRequest)
_POST_ROUTES = ("/resources/fetch", "/resources/send", "/resources/receive", "/status/send")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Buffered, so that an answer's head and body leave in one write: a client woken by the
    # head alone would only go back to sleep until the body comes.
    wbufsize = -1
    server: _UnixHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        # The default logs the client address, which a Unix socket does not have.
        pass

    def handle_expect_100(self) -> bool:
        accepted = super().handle_expect_100()
        self.wfile.flush()  # the client holds the body back until the 100 comes
        return accepted

    @property
    def bridge(self) -> BridgeServer:
        return self.server.bridge

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/openapi.json":
            self._reply(200, json.dumps(wire.openapi_document()).encode(), "application/json")
        elif path in _POST_ROUTES:
            self._reply(405, b"", None, allow="POST")
        else:
            self._reply(404, b"", None)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path not in _POST_ROUTES:
            if path == "/openapi.json":
                self._reply(405, b"", None, allow="GET")
            else:
                self._reply(404, b"", None)
            return
        try:
            raw = self._json_body()
            if path == "/resources/fetch":
                reference = self._shape(wire.REFERENCE, raw)
                self._reply(
                    200, json.dumps(self.bridge.fetch(reference)).encode(), "application/json"
                )
            elif path == "/resources/send":
                self.bridge.send(self._shape(_SEND, raw))
                self._reply(200, b"", None)
            elif path == "/resources/receive":
                self._stream(self.bridge.open_stream(self._shape(_RECEIVE, raw)))
            else:
                answer = self.bridge.status(self._shape(wire.PROGRESS, raw))
                self._reply(200, json.dumps(answer).encode(), "application/json")
        except Rejection as exc:
            self._reply(exc.status, exc.body, exc.content_type)

    def do_PUT(self) -> None:
        self._reply(405 if self.path in _POST_ROUTES else 404, b"", None)

    do_DELETE = do_PATCH = do_PUT

    # Request body, in axum's order: content type (415), size (413), JSON (400), shape (422).

    def _json_body(self) -> Any:
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        is_json = content_type == "application/json" or (
            content_type.startswith("application/") and content_type.endswith("+json")
        )
        if not is_json:
            # Drained first, so the client sees the answer, not a broken pipe.
            with suppress(Rejection):
                self._read_body()
            raise Rejection(415, "Expected request with `Content-Type: application/json`")
        body = self._read_body()
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            raise Rejection(400, f"Failed to parse the request body as JSON: {exc}") from None

    def _read_body(self) -> bytes:
        too_large = Rejection(413, "Failed to buffer the request body: length limit exceeded")
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(too_large)
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            return b""
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError(length_header)
        except ValueError:
            self.close_connection = True
            raise Rejection(400, "invalid Content-Length header") from None
        if length > MAX_BODY_BYTES:
            self._discard(length)
            raise too_large
        return self.rfile.read(length)

    def _discard(self, length: int) -> None:
        """Reads and drops a body refused for its size (see _json_body for why)."""
        if length > DRAIN_LIMIT_BYTES:
            self.close_connection = True
            return
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)

    def _read_chunked(self, too_large: Rejection) -> bytes:
        body = bytearray()
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise Rejection(400, "malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                if total > MAX_BODY_BYTES:
                    raise too_large
                return bytes(body)
            total += size
            if total > DRAIN_LIMIT_BYTES:
                self.close_connection = True
                raise too_large
            chunk = self.rfile.read(size)
            # Past the limit the rest is only drained, so the client sees the 413.
            if total <= MAX_BODY_BYTES:
                body += chunk
            self.rfile.readline(1024)

    def _shape(self, adapter: TypeAdapter[Any], raw: Any) -> Any:
        try:
            return adapter.validate_python(raw)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"]) or "body"
            raise Rejection(
                422,
                f"Failed to deserialize the JSON body into the target type: {where}: {error['msg']}",
            ) from None

    # Responses.

    def _reply(self, status: int, body: bytes, content_type: str | None, **headers: str) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.title(), value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _stream(self, events: queue.Queue[dict[str, Any] | None] | None) -> None:
        """Serves the SSE stream (chunked, as the worker's HTTP stack does) until it ends."""
        self.close_connection = True
        self.send_response(200, "OK")
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()  # the client waits for the head before any event comes
        try:
            while events is not None:
                try:
                    event = events.get(timeout=self.bridge.keepalive_s)
                except queue.Empty:
                    chunk = b": keepalive\n\n"
                else:
                    if event is None:
                        break
                    chunk = b"data: " + json.dumps(event).encode() + b"\n\n"
                self.wfile.write(b"%X\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the client went away: the stream is over, later pushes go unannounced
        finally:
            if events is not None:
                self.bridge.close_stream()
