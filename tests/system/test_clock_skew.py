"""A scheduler whose clock disagrees with the workers' (docs/protocol-actions.md, "Deadlines
and clock skew"): the stand-in's scheduler S s ahead or behind (RunOptions.
scheduler_clock_skew_s), 2 real executors, a short causal-LM job. Every run ends with exit 0
after `terminate`, every round aggregated and every aggregate applied, and each executor
tells of a skew over 2 s once. No timing is asserted: the bench (bench/clock_skew.py) measures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypha.standin.coordinator.server import Catalog, RunOptions
from hypha.standin.data_service.assets import ensure_assets
from watched_pool import PoolRun, applied, run_pool

pytestmark = pytest.mark.slow
ROUNDS = 2
RUN_TIMEOUT_S = 150.0  # a run without skew takes about 20 s; old code hung at 70 s ahead


def run_skewed(catalog: Catalog, skew_s: float, base: Path) -> tuple[PoolRun, RunOptions]:
    options = RunOptions(workers=2, rounds=ROUNDS, steps_per_round=6, scheduler_clock_skew_s=skew_s)
    return run_pool(catalog, options, base, RUN_TIMEOUT_S), options


@pytest.mark.parametrize("skew_s", [2.0, 15.0, 70.0, -70.0], ids=lambda s: f"{s:+g}s")
def test_a_skewed_scheduler_clock_ends_every_run_with_every_aggregate_applied(
    assets_dir: Path, short_tmp: Path, skew_s: float, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = Catalog.from_assets(ensure_assets(assets_dir))
    result, options = run_skewed(catalog, skew_s, short_tmp)
    out = capsys.readouterr().out
    summary, seen = result.summary, result.seen
    assert summary["cancelled"] is None, summary["cancelled"]
    assert result.codes == {"w1": 0, "w2": 0}
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
