"""The workers' side of the coordinator's small TCP API (routes: http_api.py).

Torch-free: a compose worker that only runs the shim imports this, not the coordinator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

import urllib3

from hypha.accelerate_executor.errors import ErrorKind
from hypha.standin.backend import ERROR_KINDS, Push, RemoteFile
from hypha.standin.errors import BackendError, CoordinatorError


def _backend_error(status: int, raw: bytes) -> BackendError:
    kind: ErrorKind = "connector_error"
    detail = f"coordinator answered {status}"
    try:
        error = json.loads(raw)
        detail = str(error["detail"])
        if error["error"] in ERROR_KINDS:
            kind = error["error"]
    except (ValueError, KeyError, TypeError):
        pass
    return BackendError(kind, detail)


class CoordinatorClient:
    """Keeps its connections alive (urllib3's pool): a bridge reports every training step
    through here, and a new TCP connection (and a new server thread) per report costs more
    CPU than the report. A request is never sent twice: once it went out, a failure is the
    caller's."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise CoordinatorError(f"coordinator URL must look like http://HOST:PORT, not {url!r}")
        self.url = f"http://{parts.hostname}:{parts.port or 80}"
        self.timeout_s = timeout_s
        # One connection per concurrent caller: the push poller, the status reporter, a fetch.
        self._pool = urllib3.HTTPConnectionPool(
            parts.hostname, parts.port or 80, maxsize=8, retries=False
        )

    @contextmanager
    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> Iterator[urllib3.BaseHTTPResponse]:
        """Sends one request; the caller reads the answer inside the `with` block.

        Raises BackendError(network_error) when the coordinator cannot be reached, and
        BackendError with the coordinator's kind when it answers an error.
        """
        headers = {"Content-Type": content_type} if body is not None else {}
        try:
            response = self._pool.urlopen(
                method,
                path,
                body=body,
                headers=headers,
                timeout=timeout_s or self.timeout_s,
                preload_content=False,
                release_conn=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise BackendError(
                "network_error", f"coordinator at {self.url} unreachable: {exc}"
            ) from None
        try:
            if response.status >= 400:
                raise _backend_error(response.status, response.read())
            yield response
        except BaseException:
            # An answer left half read would be taken for the next request's answer.
            response.close()
            raise
        finally:
            response.release_conn()

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

    def request_job(self, worker: str) -> str:
        """The job JSON for this worker (as the worker passes it on: one string)."""
        try:
            job = self.call("POST", "/jobs", {"worker": worker})
        except BackendError as exc:
            raise CoordinatorError(f"coordinator gave no job to {worker}: {exc.detail}") from None
        return json.dumps(job)

    def report_exit(
        self,
        job_id: str,
        exit_code: int,
        leaks: list[str],
        status: dict[str, Any] | None = None,
    ) -> None:
        body = {"exit_code": exit_code, "leaks": leaks, "status": status}
        try:
            self.call("POST", f"/jobs/{quote(job_id)}/exit", body)
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
                except (OSError, urllib3.exceptions.HTTPError) as exc:
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

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.call("POST", f"{self._prefix}/action", request)
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
                retry_s=float(response.headers.get("X-Retry-S", "0")),
            )

    def settle_push(self, seq: int, taken: bool) -> None:
        path = f"{self._prefix}/pushes/{seq}/verdict?taken={int(taken)}"
        with self.client.request("POST", path) as response:
            response.read()
