"""How long a job waits on a scheduler that never comes back before the executor gives up.

The stand-in's action-era bridge on its Unix socket answers every `/action/update` with
`500 network_error` (faults on demand, standin/worker/faults.py), as a worker's bridge does
while the scheduler is unreachable; the executor's client reports `joined` and is timed until
it gives up. Printed: the seconds, the tries, the one line it ends with, and the seconds against
the retry policy's bound (bridge/retry.py), the figure docs/faults.md states.

    python bench/retry_worst_case.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.bridge.retry import DEFAULT_POLICY, BridgeRetriesExhausted
from hypha.accelerate_executor.protocol.actions.messages import JOINED
from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
from hypha.standin.actions.bridge_http import ActionBridgeServer
from hypha.standin.backend import Push
from hypha.standin.worker.faults import FaultPlan, parse_fault


class Unreachable:
    """The network behind the bridge: nothing ever reaches it, nothing comes from it."""

    def next_push(self, after: int, wait_s: float) -> Push | None:
        time.sleep(wait_s)
        return None

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the bridge reached the network ({name}) through a fault")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hy-", dir="/tmp"))
    bridge = ActionBridgeServer(work, Unreachable(), job_id="j")
    bridge.faults = FaultPlan((parse_fault("/action/update=500:network_error:1000000"),))
    with bridge:
        client = ActionBridgeClient(bridge.socket_path, work, "j")
        started = time.monotonic()
        try:
            client.update(JOINED)
        except BridgeRetriesExhausted as exc:
            seconds = time.monotonic() - started
            print(f"gave up after {seconds:.1f} s and {exc.tries} tries: {exc}")
            print(f"ratio to the policy's bound ({DEFAULT_POLICY.total_s:.0f} s): "
                  f"{seconds / DEFAULT_POLICY.total_s:.3f}")  # fmt: skip
            return
    raise SystemExit("the client did not give up")


if __name__ == "__main__":
    main()
