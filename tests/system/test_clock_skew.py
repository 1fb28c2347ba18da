"""A scheduler whose clock disagrees with the workers' (docs/protocol-actions.md, "Deadlines
and clock skew"): the stand-in's scheduler S s ahead or behind (RunOptions.
scheduler_clock_skew_s), 2 real executors, a short causal-LM job. Every run ends with exit 0
after `terminate`, every round aggregated and every aggregate applied, and each executor
tells of a skew over 2 s once. No timing is asserted: the bench (bench/clock_skew.py) measures."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hypha.standin.coordinator.client import CoordinatorClient, JobBackend
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

pytestmark = pytest.mark.slow
ROUNDS = 2
RUN_TIMEOUT_S = 150.0  # a run without skew takes about 20 s; old code hung at 70 s ahead


@dataclass
class Seen:
    """One worker's statuses and the kinds of the answers it got."""

    states: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    sent_rounds: list[int] = field(default_factory=list)  # executor rounds in sent-update


class Watched:
    """A job's way to the coordinator, noting each status and answer."""

    def __init__(self, backend: JobBackend, seen: Seen) -> None:
        self._backend, self._seen = backend, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        details = request["status"]["details"]
        self._seen.states.append(details["state"])
        if details["state"] == "sent-update":
            self._seen.sent_rounds.append(int(details["round"]))
        answer = self._backend.action(request)
        self._seen.kinds.append(answer["next"]["action"]["kind"])
        return answer


def applied(seen: Seen) -> int:
    """The aggregates a worker applied: its executor's round at its last send (those applied
    before it), plus the last one when an `applied-update` came after that send."""
    last = len(seen.states) - 1 - seen.states[::-1].index("sent-update")
    return seen.sent_rounds[-1] + int("applied-update" in seen.states[last:])


def run_skewed(catalog: Catalog, skew_s: float, base: Path) -> tuple[dict[str, Any], Any]:
    options = RunOptions(workers=2, rounds=ROUNDS, steps_per_round=6, scheduler_clock_skew_s=skew_s)
    seen = {name: Seen() for name in ("w1", "w2")}
    codes: dict[str, int] = {}
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    with build_coordinator(catalog, options) as coordinator:
        client = CoordinatorClient(coordinator.url)

        def run(name: str) -> None:
            worker = LocalWorker(name, preset("process"), base, env={"OMP_NUM_THREADS": threads})
            backend = lambda job_id: Watched(client.backend(job_id), seen[name])  # noqa: E731
            codes[name] = serve_one_job(client, worker, backend)

        running = [threading.Thread(target=run, args=(n,), daemon=True) for n in seen]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(RUN_TIMEOUT_S)
        if any(thread.is_alive() for thread in running):
            coordinator.cancel(f"the run did not end within {RUN_TIMEOUT_S:g} s")
            for thread in running:
                thread.join(30)
        summary = coordinator.summary()
    return {"codes": codes, "seen": seen, "summary": summary}, options


@pytest.mark.parametrize("skew_s", [2.0, 15.0, 70.0, -70.0], ids=lambda s: f"{s:+g}s")
def test_a_skewed_scheduler_clock_ends_every_run_with_every_aggregate_applied(
    assets_dir: Path, short_tmp: Path, skew_s: float, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = Catalog.from_assets(ensure_assets(assets_dir))
    result, options = run_skewed(catalog, skew_s, short_tmp)
    out = capsys.readouterr().out
    summary, seen = result["summary"], result["seen"]
    assert summary["cancelled"] is None, summary["cancelled"]
    assert result["codes"] == {"w1": 0, "w2": 0}
    for name, worker in seen.items():
        assert worker.kinds[-1] == "terminate", (name, worker.kinds[-8:])
    assert len(summary["aggregations"]) == options.rounds  # every round aggregated
    assert {name: applied(worker) for name, worker in seen.items()} == {
        "w1": options.rounds,
        "w2": options.rounds,
    }
    assert not summary["digest_mismatches"]  # each applied each aggregate once
    # Each executor tells the operator once, with the figure, of a skew over 2 s.
    way = "ahead of" if skew_s > 0 else "behind"
    told = re.findall(rf"the scheduler's clock is ([\d.]+) s {way} this worker's", out)
    assert len(told) == (2 if abs(skew_s) > 2 else 0), out[-3000:]
    assert all(abs(float(figure) - abs(skew_s)) < 0.5 for figure in told), told
