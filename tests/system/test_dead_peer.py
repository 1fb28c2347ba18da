"""A peer that dies (issue 35): one worker's executor is killed mid-round, and the others
finish the job with real executors, the stand-in's parameter server going on without it
(upstream's quorum and grace); a replacement that joins later starts from the trained model.
Nothing the survivors trained is lost: each batch a `batch-completed` reported is counted in
exactly one `sent-update`, every round has a loss, and every worker holds the same global
model after as many aggregates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hypha.standin.coordinator.server import RunOptions
from hypha.standin.demo import run_demo
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.faults import parse_fault

ROUNDS = 4


@pytest.mark.slow
def test_a_dead_peer_costs_no_batch_of_the_others_and_its_replacement_starts_trained(
    assets_dir: Path, tmp_path: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = RunOptions(
        workers=2, late_workers=1, rounds=ROUNDS, steps_per_round=40, generation="actions"
    )
    run_demo(
        options, preset("process"), out_dir=tmp_path / "out", work_base=short_tmp,
        assets_dir=assets_dir, timeout_s=600, faults=(parse_fault("/resources/send=kill"),),
    )  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    out = capsys.readouterr().out
    workers = summary["workers"]
    # w1 died as it sent its first update: nothing of it was counted.
    assert "[w1 bridge] fault on demand: /resources/send killed the executor" in out
    assert workers["w1"]["exit_code"] == 137 and workers["w1"]["batches_sent"] == 0
    assert len(summary["aggregations"]) == ROUNDS
    for name in ("w2", "w3"):
        worker = workers[name]
        assert worker["exit_code"] == 0, worker
        assert worker["batches_sent"] == worker["batches_completed"] > 0, worker
        assert worker["violations"] == [], worker["violations"]  # each update's count exact
        assert all("loss" in m for m in worker["metrics"].values()), worker["metrics"]
    survivor = {int(key): m for key, m in workers["w2"]["metrics"].items()}
    assert sorted(survivor) == list(range(ROUNDS))
    assert survivor[ROUNDS - 1]["loss"] < survivor[0]["loss"]
    # The replacement got the trained model: its first loss is below round 0's.
    late = workers["w3"]
    assert late["joined_round"] >= 1 and "[w3] received the model from a peer" in out
    first_late = late["metrics"][min(late["metrics"], key=int)]["loss"]
    assert first_late < survivor[0]["loss"], (first_late, survivor)
    assert summary["digest_mismatches"] == []
    print(
        "dead peer:",
        {
            name: (w["batches_completed"], w["batches_sent"], w["batches_past_end"])
            for name, w in workers.items()
        },
        {int(k): round(m["loss"], 3) for k, m in survivor.items()},
        "late",
        {int(k): round(m["loss"], 3) for k, m in late["metrics"].items()},
        f"wall {summary['wall_s']} s",
    )
