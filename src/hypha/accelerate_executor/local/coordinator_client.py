"""The workers' side of the coordinator's small TCP API (see coordinator.py for the routes).

Torch-free: a compose worker that only runs the shim imports this, not the coordinator.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

from hypha.accelerate_executor.local.bridge_server import (
    ERROR_KINDS,
    BackendError,
    ErrorKind,
    Push,
    RemoteFile,
)


class CoordinatorError(Exception):
    """The coordinator refused a request or could not be reached; one line for the user."""


class CoordinatorClient:
    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise CoordinatorError(f"coordinator URL must look like http://HOST:PORT, not {url!r}")
        self.url = f"http://{parts.hostname}:{parts.port or 80}"
        self._host = parts.hostname
        self._port = parts.port or 80
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> http.client.HTTPResponse:
        """Sends one request on a fresh connection; the caller reads (and so closes) the answer.

        Raises BackendError(network_error) when the coordinator cannot be reached, and
        BackendError with the coordinator's kind when it answers an error.
        """
        connection = http.client.HTTPConnection(
            self._host, self._port, timeout=timeout_s or self.timeout_s
        )
        headers = {"Content-Type": content_type} if body is not None else {}
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise BackendError(
                "network_error", f"coordinator at {self.url} unreachable: {exc}"
            ) from None
        if response.status >= 400:
            raw = response.read()
            connection.close()
            kind: ErrorKind = "connector_error"
            detail = f"coordinator answered {response.status}"
            try:
                error = json.loads(raw)
                detail = str(error["detail"])
                if error["error"] in ERROR_KINDS:
                    kind = error["error"]
            except (ValueError, KeyError, TypeError):
                pass
            raise BackendError(kind, detail)
        return response

    def call(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        with self.request(method, path, body) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def wait_until_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.call("GET", "/health")
                return
            except BackendError as exc:
                if time.monotonic() >= deadline:
                    raise CoordinatorError(
                        f"no coordinator answered at {self.url} within {timeout_s:.0f} s"
                    ) from exc
                time.sleep(0.5)

    def wait_until_gone(self, poll_s: float = 1.0) -> None:
        while True:
            try:
                self.call("GET", "/health")
            except BackendError:
                return
            time.sleep(poll_s)

    def request_job(self, worker: str) -> str:
        """The job JSON for this worker (as the worker passes it on: one string)."""
        try:
            job = self.call("POST", "/jobs", {"worker": worker})
        except BackendError as exc:
            raise CoordinatorError(f"coordinator gave no job to {worker}: {exc.detail}") from None
        return json.dumps(job)

    def report_exit(self, job_id: str, exit_code: int, leaks: list[str]) -> None:
        try:
            self.call(
                "POST", f"/jobs/{quote(job_id)}/exit", {"exit_code": exit_code, "leaks": leaks}
            )
        except BackendError as exc:
            raise CoordinatorError(
                f"could not report the end of job {job_id}: {exc.detail}"
            ) from None

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = self.call("GET", "/summary")
        return summary

    def backend(self, job_id: str) -> JobBackend:
        return JobBackend(self, job_id)


class JobBackend:
    """What one job's bridge reaches beyond itself, through the coordinator."""

    def __init__(self, client: CoordinatorClient, job_id: str) -> None:
        self.client = client
        self._prefix = f"/jobs/{quote(job_id)}"

    def fetch(self, reference: dict[str, Any]) -> list[RemoteFile]:
        listing = self.client.call("POST", f"{self._prefix}/fetch", reference)
        return [RemoteFile(name=item["name"], blob=item["blob"]) for item in listing["files"]]

    def download(self, blob: str, out: BinaryIO) -> None:
        with self.client.request("GET", f"/blobs/{quote(blob)}") as response:
            while True:
                try:
                    chunk = response.read(1 << 20)
                except (OSError, http.client.HTTPException) as exc:
                    raise BackendError(
                        "network_error", f"download from the coordinator broke off: {exc}"
                    ) from None
                if not chunk:
                    return
                out.write(chunk)  # a local write failure is the bridge's io_error

    def send(self, peer: str, data: bytes) -> None:
        path = f"{self._prefix}/push?peer={quote(peer)}"
        with self.client.request("POST", path, data, "application/octet-stream") as response:
            response.read()

    def status(self, progress: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.call("POST", f"{self._prefix}/status", progress)
        return answer

    def next_push(self, after: int, wait_s: float) -> Push | None:
        path = f"{self._prefix}/pushes?after={after}&wait={wait_s}"
        with self.client.request("GET", path, timeout_s=wait_s + self.client.timeout_s) as response:
            data = response.read()
            if response.status == 204:
                return None
            return Push(
                seq=int(response.headers["X-Seq"]),
                from_peer=response.headers["X-From-Peer"],
                data=data,
            )
