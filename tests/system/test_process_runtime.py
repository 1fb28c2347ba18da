"""The executor's one-line failure reaches the operator under both worker runtimes: alpha.17's
lets the executor's stderr through to the worker's own; the later releases' keeps it out of
the worker's output and puts its last 8 KiB into the job's status (job_status.py), which the
stand-in's coordinator (the scheduler's side, the operator's view) prints and judges by."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.report import judge
from hypha.standin.job_status import ERR_TAIL_BYTES, Tail, job_status
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

FAILURE = "hypha.accelerate_executor.training: bad job: executor.config.batch_size"


class BadJobClient(CoordinatorClient):
    """The coordinator's client, but the job it hands out has a batch size serde refuses."""

    def request_job(self, worker: str) -> str:
        job: dict[str, Any] = json.loads(super().request_job(worker))
        job["executor"]["config"]["batch_size"] = -1
        return json.dumps(job)


@pytest.mark.parametrize("generation", ["actions", "alpha17"])
def test_a_bad_jobs_failure_line_reaches_the_operator(
    make_coordinator, short_dir, capfd, generation
):
    coordinator = make_coordinator(workers=1, generation=generation)
    client = BadJobClient(coordinator.url)
    assert serve_one_job(client, LocalWorker("w1", preset("process"), short_dir)) == 2
    output = "".join(capfd.readouterr())
    record = coordinator.summary()["workers"]["w1"]
    reason = judge(coordinator.summary())["reasons"][0]
    if generation == "actions":
        status = record["status"]
        assert status["state"] == "failed" and status["description"] == "Process exited with 2"
        assert FAILURE in status["err"]
        # Kept out of the worker's output: the operator sees it once, from the status.
        assert output.count(FAILURE) == 1
        assert f"[coordinator] w1's executor exited with 2: {FAILURE}" in output
        assert reason.startswith(f"w1's executor exited with 2: {FAILURE}")
    else:
        assert record["status"] is None
        # The executor's stderr is the worker's: its line comes out as the executor wrote it.
        assert any(line.startswith(FAILURE) for line in output.splitlines())
        assert reason == "w1's executor exited with 2"


def test_the_status_keeps_the_last_8_kib_of_stderr_and_2_kib_of_stdout() -> None:
    err, out = Tail(ERR_TAIL_BYTES), Tail(2048)
    err.feed(b"x" * 10_000)
    err.feed(b"\xff last line\n")  # not UTF-8: replaced, as upstream decodes it
    out.feed(b"o" * 3000)
    status = job_status(1, cancelled=False, killed=False, out=out, err=err)
    assert len(status["err"].encode()) == ERR_TAIL_BYTES + 2  # U+FFFD is 3 bytes for 1
    assert status["err"].endswith("\ufffd last line\n")
    assert status["out"] == "o" * 2048
    cancelled = job_status(143, cancelled=True, killed=False, out=Tail(1), err=Tail(1))
    assert cancelled == {
        "state": "cancelled",
        "description": "Process cancelled and exited with 143",
        "out": None,
        "err": None,
    }
