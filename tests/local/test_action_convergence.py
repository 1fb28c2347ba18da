"""No livelock at the end of a round: fast workers against the stand-in's action-era
scheduler (upstream's decisions, local/action_scheduler.py) answering at once, each worker
answering as the executor does (`action_loop.status_after_batches`), on a simulated clock.
With `batch-completed{0}` after `execute-batch{0}` (the executor's answer before issue 34),
each worker's clock moves at every zero answer and, with one batch left, each is projected
0 for ever; with `idle` every round ends."""

from __future__ import annotations

import heapq

import pytest

from hypha.accelerate_executor.bridge.actions import (
    APPLIED_UPDATE,
    IDLE,
    JOINED,
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    SendUpdate,
    Status,
    Terminate,
    sent_update,
)
from hypha.accelerate_executor.training.action_loop import MIN_LOOP_S, status_after_batches
from hypha.standin.scheduler.action_scheduler import ActionScheduler

BATCH_SIZE = 8
ROUNDS = 3
MAX_ANSWERS = 20_000  # a livelock's bound: a round of 150 batches takes a few hundred


def run(step_s: list[float], target_samples: int) -> tuple[int, int, dict[str, int]]:
    """Plays the pool until every worker is told `terminate` or MAX_ANSWERS answers passed;
    the parameter server aggregates once every worker reported `sent-update` and its
    broadcast is over at once (upstream's order). Returns rounds, zero answers and each
    worker's trained samples."""
    now = [0.0]
    scheduler = ActionScheduler(
        target_samples, ROUNDS, "ps", clock=lambda: now[0], wall=lambda: now[0]
    )
    names = [f"w{i}" for i in range(len(step_s))]
    for name in names:
        scheduler.add_worker(name, BATCH_SIZE)
    queue: list[tuple[float, int, str, Status]] = [
        (0.0, i, name, JOINED) for i, name in enumerate(names)
    ]
    trained = dict.fromkeys(names, 0)
    zeros = answers = 0
    while queue and answers < MAX_ANSWERS:
        at, index, name, status = heapq.heappop(queue)
        now[0] = at
        action = scheduler.answer(name, status)
        answers += 1
        if status.state == "sent-update" and set(names) <= scheduler.sent:
            scheduler.aggregated()
            scheduler.broadcasted()
        match action:
            case ExecuteBatch(batches=0):
                zeros += 1
                at, status = at + MIN_LOOP_S, status_after_batches(BATCH_SIZE, 0)
            case ExecuteBatch(batches=batches):
                trained[name] += batches * BATCH_SIZE
                at += batches * step_s[index]
                status = status_after_batches(BATCH_SIZE, batches)
            case SendUpdate():
                at, status = at + 0.01, sent_update(scheduler.round, {})
            case ApplyUpdate():
                at, status = at + 0.01, APPLIED_UPDATE
            case Idle(deadline=deadline):
                at, status = max(deadline, at + MIN_LOOP_S), IDLE
            case Terminate():
                continue
        heapq.heappush(queue, (at, index, name, status))
    return scheduler.round, zeros, trained


@pytest.mark.parametrize(
    "step_s", [[0.03, 0.03], [0.03, 0.03, 0.03], [0.03, 0.05], [0.02, 0.03, 0.07]]
)
def test_fast_workers_finish_every_round(step_s: list[float]) -> None:
    target = 150 * BATCH_SIZE
    rounds, zeros, trained = run(step_s, target)
    assert rounds >= ROUNDS, f"{rounds} rounds, {zeros} execute-batch{{0}} answers"
    assert all(trained.values()), trained  # every worker trained
