"""The local stand-in's own failures: a branch of the executor's error tree
(hypha.accelerate_executor.errors), kept here because no worker or image of the executor
raises them. Each ends a command in one line and exit code 1, as every HyphaError does.

    LocalError              the local stand-in for the Hypha side
    ├── BridgeRefusal       a request the bridge refuses: its HTTP status and body
    ├── BackendError        a failure beyond the bridge, answered 500 with its kind
    ├── CoordinatorRefusal  a request the coordinator refuses (status, kind)
    ├── ProgressError       a progress message the scheduler answers with Error
    ├── WorkerError         the local worker cannot run the job
    └── CoordinatorError    the coordinator refused a request or cannot be reached
"""

from __future__ import annotations

from hypha.accelerate_executor.errors import ErrorKind, HyphaError


class LocalError(HyphaError):
    """A failure of the local stand-in (coordinator, worker, bridge server)."""


class BridgeRefusal(LocalError):
    """A request refused before or at its route: status, body and its content type."""

    def __init__(
        self, status: int, body: str, content_type: str = "text/plain; charset=utf-8"
    ) -> None:
        super().__init__(body)
        self.status = status
        self.body = body.encode()
        self.content_type = content_type


class BackendError(LocalError):
    """A failure beyond the bridge; the bridge answers it with 500 and this kind."""

    def __init__(self, kind: ErrorKind, detail: str) -> None:
        super().__init__(detail)
        self.kind: ErrorKind = kind
        self.detail = detail


class CoordinatorRefusal(LocalError):
    """A request the coordinator refuses: the HTTP status, the error kind, one line."""

    def __init__(self, status: int, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail


class ProgressError(LocalError):
    """A progress message the stand-in's scheduler answers with {"type": "Error"}."""


class WorkerError(LocalError):
    """The local worker cannot run the job."""


class CoordinatorError(LocalError):
    """The coordinator refused a request or cannot be reached."""
