"""What the retry wrapper (bridge/retry.py) costs a request that succeeds at once: the
bridge client's JSON request against a bridge that answers every request at once, on a
Unix socket, through the wrapper and with the wrapper replaced by a plain call.

    python bench/retry_overhead.py [--requests 2000] [--repeats 7]

The bridge is bench/answering_bridge.py in a process of its own. Each repeat times a block
of requests each way, in turns, and the figure is the median of the repeats' microseconds
per request; the ratio is wrapped over plain. Every request of the executor (each batch's
status, fetch, send, the action protocol's updates) goes through the wrapper.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.bridge import client as client_module
from hypha.accelerate_executor.bridge.client import BridgeClient
from hypha.accelerate_executor.bridge.retry import retrying
from hypha.accelerate_executor.protocol.alpha17.messages import STATUS_ROUTE

BODY = {"type": "Metrics", "round": 1, "metrics": {"loss": 1.0}}


def plain(route: str, attempt: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
    return attempt()


@contextmanager
def answering_bridge(socket_path: Path) -> Iterator[None]:
    bridge = Path(__file__).with_name("answering_bridge.py")
    process = subprocess.Popen([sys.executable, str(bridge), str(socket_path)])
    try:
        deadline = time.monotonic() + 10
        while not socket_path.exists():
            if time.monotonic() > deadline:
                raise SystemExit("the answering bridge did not start")
            time.sleep(0.01)
        yield
    finally:
        process.terminate()
        process.wait()


def block(client: BridgeClient, requests: int) -> float:
    """Microseconds per request over `requests` requests."""
    started = time.perf_counter()
    for _ in range(requests):
        client.post_json(STATUS_ROUTE, BODY, 10.0)
    return 1e6 * (time.perf_counter() - started) / requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hypha-retry-") as folder:
        socket_path = Path(folder) / "bridge.sock"
        with answering_bridge(socket_path):
            client = BridgeClient(socket_path, Path(folder))
            block(client, 200)  # warm-up: the kept-alive connection, the imports
            wrapped, unwrapped = [], []
            for _ in range(args.repeats):
                client_module.retrying = retrying
                wrapped.append(block(client, args.requests))
                client_module.retrying = plain
                unwrapped.append(block(client, args.requests))
            client_module.retrying = retrying
    with_wrapper, without = statistics.median(wrapped), statistics.median(unwrapped)
    print(
        f"{args.requests} requests x {args.repeats} repeats: {with_wrapper:.1f} us a request "
        f"with the retry wrapper, {without:.1f} us without; ratio {with_wrapper / without:.3f}"
    )


if __name__ == "__main__":
    main()
