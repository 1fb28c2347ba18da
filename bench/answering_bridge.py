"""A bridge that answers every request with Continue, at once, on a Unix socket: the other
end of the statuses in the step-overhead benchmark, in a process of its own (standard
library only, so it starts in a moment), so that its CPU is not counted as the executor's.

    python bench/answering_bridge.py SOCKET_PATH
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import UnixStreamServer
from typing import Any


class _Continue(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"type": "Continue"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _UnixServer(ThreadingHTTPServer, UnixStreamServer):
    daemon_threads = True

    def server_bind(self) -> None:
        UnixStreamServer.server_bind(self)
        self.server_name, self.server_port = "hypha", 0


if __name__ == "__main__":
    _UnixServer(sys.argv[1], _Continue).serve_forever()
