"""A service the shim offers the executor's container on a Unix socket in the work dir (the
telemetry relay, the Hub upload): the container has no network, so these are its only ways
out, and only the job's own uid may connect."""

from __future__ import annotations

import contextlib
import os
import socketserver
import threading


class OwnerOnlySocket:
    """Serves `server` (bound to `socket_path`, not yet activated) from `start()` until
    `stop()`, connectable by `owner` (the container's uid:gid) only."""

    def __init__(
        self,
        socket_path: str,
        server: socketserver.UnixStreamServer,
        owner: tuple[int, int],
        name: str,
    ) -> None:
        self.socket_path = socket_path
        self._server = server
        self._owner = owner
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)

    def start(self) -> None:
        try:
            self._server.server_bind()
            # Before listen() nobody can connect: the socket is never reachable more widely.
            os.chmod(self.socket_path, 0o600)
            if os.geteuid() != self._owner[0]:
                os.chown(self.socket_path, *self._owner)
            self._server.server_activate()
        except OSError:
            self._server.server_close()
            self._unlink()
            raise
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self._unlink()

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
