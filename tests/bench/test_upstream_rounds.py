"""bench/upstream_rounds.py's tally of one worker, fed the statuses upstream's accelerate
executor sends and the answers it gets: what the scheduler counted, what it trained, and which
`applied-update` is one."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def status(state: str, **fields: Any) -> dict[str, Any]:
    return {"job_id": "j", "status": {"executor": "train", "details": {"state": state, **fields}}}


def answer(kind: str, **fields: Any) -> dict[str, Any]:
    return {"job_id": "j", "next": {"executor": "train", "action": {"kind": kind, **fields}}}


def test_upstreams_statuses_are_counted_as_its_loop_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    bench = importlib.import_module("bench.upstream_rounds")
    exchanges = [  # upstream's: no `batches`, and its last status again after execute-batch{0}
        (status("joined"), answer("execute-batch", batches=3)),
        (status("batch-completed", batch_size=8), answer("execute-batch", batches=0)),
        (status("batch-completed", batch_size=8), answer("send-update")),
        (status("sent-update", round=1, metrics={"loss": 5.0}), answer("apply-update")),
        (status("applied-update"), answer("execute-batch", batches=0)),
        (status("applied-update"), answer("terminate")),
    ]
    answers = iter(reply for _, reply in exchanges)
    backend = SimpleNamespace(action=lambda request: next(answers))
    coordinator = SimpleNamespace(actions=SimpleNamespace(round=0))
    tally = bench.Tally(upstream=True)
    noted = bench.Noted(backend, coordinator, tally, 0.0)
    for request, reply in exchanges:
        assert noted.action(request) == reply
    assert (tally.counted, tally.trained, tally.zero_answers) == (16, 24, 2)
    assert [own for _, _, own in tally.sends] == [0]  # its round counts from 1
    assert tally.applied_after_last_send
