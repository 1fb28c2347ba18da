"""No livelock at the end of a round: fast workers against the stand-in's action-era
scheduler (upstream's decisions, local/action_scheduler.py) answering at once, each worker
answering as the executor does (`training/actions/loop.py`, `status_after_batches`), on a simulated clock.
With `batch-completed{0}` after `execute-batch{0}` (the executor's answer before issue 34),
each worker's clock moves at every zero answer and, with one batch left, each is projected
0 for ever; with `idle` every round ends. And how long the rounds take on that clock with the
executor's wait after `execute-batch{0}` (about a batch) against upstream's executors' 100 ms:
deterministic, no wall clock."""

from __future__ import annotations

import heapq

import pytest

from hypha.accelerate_executor.protocol.actions.messages import (
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
from hypha.accelerate_executor.training.actions.loop import (
    MIN_LOOP_S,
    status_after_batches,
    zero_batches_wait,
)
from hypha.standin.actions.scheduler import ActionScheduler

BATCH_SIZE = 8
ROUNDS = 3
MAX_ANSWERS = 20_000  # a livelock's bound: a round of 150 batches takes a few hundred


def run(
    step_s: list[float], target_samples: int, zero_wait: str = "batch"
) -> tuple[int, int, dict[str, int], float]:
    """Plays the pool until every worker is told `terminate` or MAX_ANSWERS answers passed;
    the parameter server aggregates once every worker reported `sent-update` and its
    broadcast is over at once (upstream's order). After `execute-batch{0}` a worker waits
    about its batch (`zero_wait="batch"`, the executor's) or 100 ms (`"min-loop"`). Returns
    rounds, zero answers, each worker's trained samples and the clock at the last answer."""
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
                wait = zero_batches_wait(step_s[index]) if zero_wait == "batch" else MIN_LOOP_S
                at, status = at + wait, status_after_batches(BATCH_SIZE, 0)
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
    return scheduler.round, zeros, trained, now[0]


@pytest.mark.parametrize(
    "step_s", [[0.03, 0.03], [0.03, 0.03, 0.03], [0.03, 0.05], [0.02, 0.03, 0.07]]
)
def test_fast_workers_finish_every_round(step_s: list[float]) -> None:
    target = 150 * BATCH_SIZE
    rounds, zeros, trained, _ = run(step_s, target)
    assert rounds >= ROUNDS, f"{rounds} rounds, {zeros} execute-batch{{0}} answers"
    assert all(trained.values()), trained  # every worker trained


@pytest.mark.parametrize("step_s", [[0.03, 0.03], [0.03, 0.03, 0.03], [0.02, 0.03, 0.07]])
def test_waiting_a_batch_after_zero_batches_ends_the_rounds_sooner(step_s: list[float]) -> None:
    """A worker told `execute-batch{0}` asks again once a peer has likely reported a batch,
    not after upstream's 100 ms: the same pool's rounds end sooner on the simulated clock,
    for no more samples (the scheduler still decides every batch)."""
    target = 150 * BATCH_SIZE
    *_, trained, batch_end = run(step_s, target, zero_wait="batch")
    *_, trained_min_loop, min_loop_end = run(step_s, target, zero_wait="min-loop")
    assert batch_end < min_loop_end, (batch_end, min_loop_end)
    assert sum(trained.values()) <= sum(trained_min_loop.values()) + len(step_s) * BATCH_SIZE
