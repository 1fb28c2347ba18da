"""The job status that the process runtime of Hypha's workers after alpha.17 reports
(docs/protocol-actions.md, "Process runtime"): success, failed or cancelled, with the last
2 KiB of the executor's stdout (which it also echoes) and the last 8 KiB of its stderr
(which it keeps out of its log). Read off upstream's crates/worker/src/executor/process.rs
(index id 66488127254).
"""

from __future__ import annotations

from typing import Any

OUT_TAIL_BYTES = 2 * 1024
ERR_TAIL_BYTES = 8 * 1024


class Tail:
    """The last `limit` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._data = bytearray()

    def feed(self, chunk: bytes) -> bool:
        self._data += chunk
        del self._data[: max(0, len(self._data) - self.limit)]
        return True

    def text(self) -> str | None:
        """Decoded as upstream does (invalid UTF-8 replaced); None when nothing came."""
        return self._data.decode("utf-8", "replace") if self._data else None


def job_status(
    exit_code: int, cancelled: bool, killed: bool, out: Tail, err: Tail
) -> dict[str, Any]:
    if cancelled:
        state = "cancelled"
        description = (
            "Process force killed" if killed else f"Process cancelled and exited with {exit_code}"
        )
    elif exit_code == 0:
        state, description = "success", None
    else:
        state, description = "failed", f"Process exited with {exit_code}"
    return {"state": state, "description": description, "out": out.text(), "err": err.text()}


def last_line(text: str | None) -> str | None:
    """The last non-blank line: an executor's failure is its one line on stderr."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else None
