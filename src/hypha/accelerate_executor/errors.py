"""The executor's exception types. Each message is one line a worker's log can show as is."""

from __future__ import annotations


class ExecutorError(Exception):
    """Base of every failure the executor reports with one line and a non-zero exit."""

    exit_code = 1


class JobSpecError(ExecutorError):
    """The job JSON is malformed or asks for something this executor does not do."""

    exit_code = 2


class UntrainableJobError(JobSpecError):
    """A job Hypha's Rust side accepts that this executor cannot train: one of the README's
    "Jobs refused beyond serde"."""


class BridgeError(ExecutorError):
    """The bridge answered a request with an error."""

    def __init__(self, route: str, status: int, error: str, detail: str) -> None:
        super().__init__(f"bridge {route} failed: {status} {error}: {detail}")
        self.route = route
        self.status = status
        self.error = error
        self.detail = detail


class BridgeGoneError(ExecutorError):
    """The bridge cannot be reached any more: socket gone, refused, or stream closed."""


class UnsafePathError(ExecutorError):
    """The bridge handed back a path outside the work dir."""


class SchedulerError(ExecutorError):
    """The scheduler answered with Error, or with something this executor does not know."""
