"""HTTP/1.1 on a Unix socket, as little of it as the statuses need: connecting, a POST
request's bytes, and a response read as its bytes arrive, so that one thread can read the
answers of several connections without waiting on any of them."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

from hypha.accelerate_executor.bridge.retry import RetryPolicy

# A full backlog empties as the bridge accepts: milliseconds, so the pauses are too.
BACKLOG_POLICY = RetryPolicy(first_pause_s=0.002, max_pause_s=0.1)


def connect_unix(path: Path, timeout: float) -> socket.socket:
    """A stream socket connected to `path`, with `timeout` set on it.

    A Unix socket whose listen backlog is full refuses at once with EAGAIN rather than
    queueing the caller, as TCP would: several statuses connecting at the same moment can
    meet that, so it tries again until `timeout` has passed."""
    deadline = time.monotonic() + timeout
    tries = 0
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except BlockingIOError:
            sock.close()
            tries += 1
            pause = BACKLOG_POLICY.pause(tries)
            if time.monotonic() + pause > deadline:
                raise TimeoutError("the bridge's connection backlog stayed full") from None
            time.sleep(pause)
            continue
        except OSError:
            sock.close()
            raise
        return sock


def post_request(route: str, body: bytes) -> bytes:
    """A POST of a JSON `body` to `route`, as bytes to write."""
    head = (
        f"POST {route} HTTP/1.1\r\nHost: hypha\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    keep_alive: bool  # whether the connection may carry another request


class ResponseReader:
    """One response, fed the bytes of its connection as they arrive. Its body is framed by
    Content-Length, by chunks, or (neither given) by the connection's end."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._status = 0
        self._keep_alive = False
        self._length: int | None = None  # of the body, when Content-Length gives it
        self._chunked = False
        self._head_read = False

    def feed(self, data: bytes) -> Response | None:
        """Takes what the socket gave (b"" at its end); returns the response once it is
        whole. ValueError for bytes that are not an HTTP/1.x response, ConnectionError for a
        connection that ended before its response did."""
        self._buffer += data
        if not self._head_read and not self._read_head():
            if not data:
                raise ConnectionError("the bridge closed the connection before answering")
            return None
        body = self._body(ended=not data)
        if body is None:
            if not data:
                raise ConnectionError("the bridge closed the connection in mid-answer")
            return None
        framed = self._length is not None or self._chunked  # else the end was the frame
        return Response(self._status, body, self._keep_alive and framed)

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        status_line, *lines = self._buffer[:end].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP/1.x response: {status_line[:80]!r}")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        del self._buffer[: end + 4]
        self._status = int(rest[:3])
        if 100 <= self._status < 200:  # an interim answer; the real one follows
            return self._read_head()
        connection = headers.get("connection", "")
        self._keep_alive = (
            connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
        )
        self._chunked = "chunked" in headers.get("transfer-encoding", "")
        if self._status in (204, 304):
            self._length = 0
        elif not self._chunked and "content-length" in headers:
            self._length = int(headers["content-length"])
        self._head_read = True
        return True

    def _body(self, ended: bool) -> bytes | None:
        if self._chunked:
            return self._chunks()
        if self._length is not None:
            return (
                bytes(self._buffer[: self._length]) if len(self._buffer) >= self._length else None
            )
        return bytes(self._buffer) if ended else None

    def _chunks(self) -> bytes | None:
        body = bytearray()
        at = 0
        while True:
            line_end = self._buffer.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(self._buffer[at:line_end].split(b";")[0], 16)
            if size == 0:  # the last chunk; the trailers, if any, end with an empty line
                trailers = line_end + 2
                if self._buffer[trailers : trailers + 2] == b"\r\n":
                    return bytes(body)
                return bytes(body) if self._buffer.find(b"\r\n\r\n", trailers) >= 0 else None
            start = line_end + 2
            if len(self._buffer) < start + size + 2:
                return None
            body += self._buffer[start : start + size]
            at = start + size + 2
