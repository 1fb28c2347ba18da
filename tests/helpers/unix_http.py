"""A real HTTP server on a real Unix socket, for tests that play the bridge's side."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that says nothing on stderr and answers in one call."""

    def reply(self, status: int, kind: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def reply_json(self, value: Any, status: int = 200) -> None:
        self.reply(status, "application/json", json.dumps(value).encode())

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(socket_path: Path, handler: type[socketserver.BaseRequestHandler]) -> Iterator[Path]:
    """Serves `handler` on `socket_path` until the block ends."""
    server = UnixHTTPServer(str(socket_path), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield socket_path
    finally:
        server.shutdown()
        server.server_close()
