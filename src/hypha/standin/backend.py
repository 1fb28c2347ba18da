"""What a Job Bridge reaches beyond itself: the contract between a bridge and its backend.

The local cluster has two backends: one over the coordinator's TCP API
(coordinator/client.py: JobBackend) and one by direct calls when the coordinator runs in the
same process (coordinator/in_process.py: InProcessBackend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, get_args

from hypha.accelerate_executor.errors import ErrorKind

ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


@dataclass(frozen=True)
class RemoteFile:
    """One file a fetch yields: its name under artifacts/ and the backend's handle to it."""

    name: str
    blob: str


# How long upstream's worker's bridge goes on trying a send that a peer's worker refused (no
# receive open): 20 tries 50 ms apart, each pause scaled by a random factor in [0, 1)
# (`send_resource`, crates/worker/src/executor/bridge.rs, index id 66437242790), about half a
# second. A parameter server's broadcast is not tried again (its executor, index id
# 66485112720).
PEER_SEND_RETRY_S = 0.5


@dataclass(frozen=True, eq=False)
class Push:
    """A file a peer pushed to this job; `seq` orders the pushes of one job. `retry_s`: how
    long its pusher goes on trying while the job's worker refuses it (no receive open); a
    pusher that tries (a peer's send) waits for the bridge's verdict (`settle_push`)."""

    seq: int
    from_peer: str
    data: bytes
    retry_s: float = 0.0


class BridgeBackend(Protocol):
    def fetch(self, reference: dict[str, Any]) -> list[RemoteFile]: ...

    def download(self, blob: str, out: BinaryIO) -> None: ...

    def send(self, peer: str, data: bytes) -> None: ...

    def status(self, progress: Any) -> dict[str, Any]: ...

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        """An ActionRequest answered with the scheduler's ActionResponse (action protocol)."""
        ...

    def next_push(self, after: int, wait_s: float) -> Push | None:
        """The first push with seq > after, waiting up to wait_s; None if there is none yet."""
        ...

    def settle_push(self, seq: int, taken: bool) -> None:
        """The bridge's verdict on push `seq`, told once for every action-era push: a
        receive took it (or it is kept for the next one), or the bridge refused it. A
        pusher that tries waits for it, as upstream's connector fails the pusher's send."""
        ...
