"""The stand-in's job JSON as upstream's serde writes it: `preprocessor` and `scheduler` left
out when unset (`skip_serializing_if`), where upstream's own executor reads a present null as
a table and fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hypha.accelerate_executor.protocol.actions.job import parse_action_job_bytes
from hypha.accelerate_executor.protocol.alpha17.job import parse_job_bytes
from hypha.standin.data_service.service import Catalog
from hypha.standin.generations import job_spec
from hypha.standin.jobs import RunOptions, new_peer_id

CATALOG = Catalog(Path("models"), Path("data"), "markov", "local/demo", ("model.safetensors",))
JOB_ID, PEERS = "6f1c2a9e-0d4b-4c8e-9a7f-3b5d1e2c4a60", (new_peer_id(), new_peer_id())


@pytest.mark.parametrize("generation", ["actions", "alpha17"])
def test_unset_preprocessor_and_scheduler_are_left_out(generation: str) -> None:
    options = RunOptions(generation=generation, lr_schedule="constant")  # type: ignore[arg-type]
    spec = job_spec(JOB_ID, options, CATALOG, *PEERS)
    config = spec["executor"]["config"]
    assert "preprocessor" not in config and "scheduler" not in config
    assert config["model"]["artifact"]["token"] is None  # upstream's other options stay null
    parse = parse_action_job_bytes if generation == "actions" else parse_job_bytes
    parse(json.dumps(spec).encode())  # each generation's serde still reads it


def test_a_set_scheduler_is_written() -> None:
    options = RunOptions(lr_schedule="cosine-with-warmup")
    spec = job_spec(JOB_ID, options, CATALOG, *PEERS)
    assert spec["executor"]["config"]["scheduler"]["type"] == "cosine-with-warmup"
