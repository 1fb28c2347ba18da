"""One job's bridge backend when the worker runs in the coordinator's process: the
coordinator's job calls (core.py), without the TCP API's HTTP hop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hypha.standin.backend import ERROR_KINDS, Push, RemoteFile
from hypha.standin.errors import BackendError, CoordinatorRefusal


class JobCalls(Protocol):
    """What a coordinator answers for a job's bridge (core.CoordinatorCore does)."""

    def fetch(self, job_id: str, reference: dict[str, Any]) -> list[dict[str, str]]: ...

    def blob_path(self, blob: str) -> Path: ...

    def push(self, job_id: str, peer: str, data: bytes) -> None: ...

    def status(self, job_id: str, progress: Any) -> dict[str, Any]: ...

    def action(self, job_id: str, request: dict[str, Any]) -> dict[str, Any]: ...

    def next_push(self, job_id: str, after: int, wait_s: float) -> Push | None: ...

    def settle_push(self, job_id: str, seq: int, taken: bool) -> None: ...


@contextmanager
def _as_backend_error() -> Iterator[None]:
    """The coordinator's refusals as the bridge sees them over TCP (client.py)."""
    try:
        yield
    except CoordinatorRefusal as exc:
        kind = exc.kind if exc.kind in ERROR_KINDS else "connector_error"
        raise BackendError(kind, exc.detail) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError("connector_error", f"malformed request: {exc}") from None


def _unreadable(path: Path, exc: OSError) -> BackendError:
    return BackendError("connector_error", f"cannot read {path.name}: {exc.strerror}")


class InProcessBackend:
    """One job's bridge backend when the worker runs in the coordinator's process: the
    calls the TCP API makes, without the HTTP hop.

    A Hypha scheduler runs on another machine. Its stand-in runs on the executor's cores,
    and over TCP it cost them about three times what the bridge itself costs per `status`
    (an HTTP client in the bridge, an HTTP server here, two more thread wake-ups).
    """

    def __init__(self, coordinator: JobCalls, job_id: str) -> None:
        self._coordinator = coordinator
        self._job_id = job_id

    def fetch(self, reference: dict[str, Any]) -> list[RemoteFile]:
        with _as_backend_error():
            files = self._coordinator.fetch(self._job_id, reference)
        return [RemoteFile(name=item["name"], blob=item["blob"]) for item in files]

    def download(self, blob: str, out: BinaryIO) -> None:
        with _as_backend_error():
            path = self._coordinator.blob_path(blob)
        try:
            source = path.open("rb")
        except OSError as exc:
            raise _unreadable(path, exc) from None
        with source:
            while True:
                try:
                    chunk = source.read(1 << 20)
                except OSError as exc:
                    raise _unreadable(path, exc) from None
                if not chunk:
                    return
                out.write(chunk)  # a local write failure is the bridge's io_error

    def send(self, peer: str, data: bytes) -> None:
        with _as_backend_error():
            self._coordinator.push(self._job_id, peer, data)

    def status(self, progress: Any) -> dict[str, Any]:
        with _as_backend_error():
            return self._coordinator.status(self._job_id, progress)

    def next_push(self, after: int, wait_s: float) -> Push | None:
        with _as_backend_error():
            return self._coordinator.next_push(self._job_id, after, wait_s)

    def settle_push(self, seq: int, taken: bool) -> None:
        with _as_backend_error():
            self._coordinator.settle_push(self._job_id, seq, taken)

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        with _as_backend_error():
            return self._coordinator.action(self._job_id, request)
