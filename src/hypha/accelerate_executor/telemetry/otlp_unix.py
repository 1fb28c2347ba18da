"""The OTLP/HTTP exporters' requests session, pointed at a Unix socket: how the executor in
a container without network reaches the shim's relay (docs/telemetry.md). The SDK encodes
and sends as it always does; only the connection is made to the socket."""

from __future__ import annotations

import socket
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection

# The relay answers whatever host is named; the path picks the signal.
RELAY_URL = "http://otlp-relay"


class _UnixConnection(HTTPConnection):
    def __init__(self, *args: Any, socket_path: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._socket_path = socket_path

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if isinstance(self.timeout, int | float):
            sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        return sock


class _UnixPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _UnixConnection


class _UnixAdapter(HTTPAdapter):
    def __init__(self, socket_path: str) -> None:
        super().__init__()
        self._pool = _UnixPool("otlp-relay", socket_path=socket_path)

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> _UnixPool:
        return self._pool

    def close(self) -> None:
        self._pool.close()
        super().close()


def unix_session(socket_path: str) -> requests.Session:
    """A session whose every http:// request goes to `socket_path`."""
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment stands between it and the socket
    session.mount("http://", _UnixAdapter(socket_path))
    return session
