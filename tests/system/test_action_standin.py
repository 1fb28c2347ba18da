"""The stand-in's action-era side end to end, with real executors: a late joiner starts from
the trained model and sends weighted updates; the tiny GPT-2 (tied input and output
embeddings, transformers' default) merges and trains: the tied pair is one tensor."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.report import judge
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import AssetSpec, build_model, ensure_assets
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

pytestmark = pytest.mark.slow
TIED = ("transformer.wte.weight", "lm_head.weight")


def test_a_late_joiner_starts_from_the_trained_model_and_tied_gpt2_merges(
    tmp_path: Path, short_tmp: Path
) -> None:
    assert build_model(AssetSpec()).config.tie_word_embeddings  # the job's GPT-2 is tied
    options = RunOptions(workers=2, late_workers=1, rounds=4, steps_per_round=20)
    assert options.generation == "actions"  # the default
    catalog = Catalog.from_assets(ensure_assets(tmp_path / "assets", options.asset_spec()))
    threads = str(max(1, (os.cpu_count() or 1) // options.all_workers))
    with build_coordinator(catalog, options) as coordinator:
        client = CoordinatorClient(coordinator.url)
        workers = [
            LocalWorker(f"w{i}", preset("process"), short_tmp, env={"OMP_NUM_THREADS": threads})
            for i in (1, 2, 3)
        ]
        codes: dict[str, int] = {}

        def run(worker: LocalWorker, late: bool) -> None:
            # The coordinator holds the pool's statuses while the joiner is behind (its
            # executor may start more slowly than a short job's rounds pass).
            if late and not coordinator.wait_for_round(1, 300):
                return
            codes[worker.name] = serve_one_job(client, worker)

        running = [
            threading.Thread(target=run, args=(worker, worker.name == "w3"), daemon=True)
            for worker in workers
        ]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(600)
        summary = coordinator.summary()
        buffers = coordinator.aggregation.optimizer.buffers
    verdict = judge(summary)
    assert codes == {"w1": 0, "w2": 0, "w3": 0}, verdict["reasons"]
    assert verdict["passed"], verdict["reasons"]
    late = summary["workers"]["w3"]
    assert late["joined_round"] >= 1
    first_round = [summary["workers"][w]["metrics"][0]["loss"] for w in ("w1", "w2")]
    late_losses = [m["loss"] for m in late["metrics"].values()]
    # It starts from the trained model: every loss it reports is below round 1's mean.
    assert late_losses and max(late_losses) < sum(first_round) / 2, (late_losses, first_round)
    # And sends updates weighted by its share of each round's samples.
    weights = [m["weight"] for m in late["metrics"].values()]
    assert all(0 < weight < 1 for weight in weights), weights
    # The tied pair travels, merges and loads as one tensor under its first name (the
    # executor's canonical names): the update holds it, nothing was left out, and a model
    # whose head missed the merge could not have trained to the loss above.
    embedding, head = TIED
    assert embedding in buffers and head not in buffers
    assert all(not record["skipped_tensors"] for record in summary["aggregations"])
    assert len(summary["aggregations"]) == options.rounds
