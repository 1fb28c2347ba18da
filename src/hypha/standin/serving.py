"""Socket-server plumbing both local servers share (the bridge on a Unix socket, the
coordinator on TCP): an accept loop without polling, and connections cut on stop."""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
from contextlib import suppress
from typing import Any

from hypha.standin.console import warn

# Both servers' listen backlog: what tokio's listeners use (mio listens with 1024), where
# socketserver's default of 5 would refuse a burst of concurrent statuses.
LISTEN_BACKLOG = 1024


class TracksConnections(socketserver.BaseServer):
    """Mixed into a threading socketserver: remembers the connections it has open, because
    stopping a server stops only its accept loop, and kept-alive connections would go on
    being served until cut. Failed requests are one line under `log_name`."""

    log_name = "server"

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

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback; a client that hung up is normal, the rest is one line.
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            warn(self.log_name, f"request failed: {error!r}")

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
