"""The stand-in's action-era scheduler decides as upstream's does: upstream's own unit tests of
the action logic, replayed against `local/action_scheduler.py`, as test_local_scheduler.py
replays alpha.17's.

Sources (hypha-space/hypha; indexed copies named by their source-index id, as
docs/protocol-actions.md names them):

- `crates/scheduler/src/scheduling/batch_scheduler.rs`, id 66542311247: the train scheduler
  with `batch-completed{batch_size, batches}` and `execute-batch{batches}`; its
  `batch_scheduler_tests` module;
- `crates/scheduler/src/statistics.rs`, id 66460343894: `running_mean_update`,
  `running_mean_weighted_update`;
- `crates/scheduler/src/simulation.rs`, id 66551745366: `test_simulation_hits_steps_cap`,
  `test_simulation_hits_update_target`.

`crates/scheduler/src/scheduling/rl_scheduler.rs` (id 66469012466, commit 3ecdb782) has no
test module; its train branch is the same logic as batch_scheduler.rs's.

Upstream drives its parameter server through statuses (`idle` -> aggregate-updates,
`aggregated-updates` -> broadcast-update, `broadcasted-update` -> idle); here the
coordinator's parameter server calls `senders()`, `aggregated()` and `broadcasted()` at those
moments, and the replays call them where upstream's tests send those statuses.
"""

from __future__ import annotations

import pytest

from hypha.accelerate_executor.protocol.actions.messages import (
    APPLIED_UPDATE,
    IDLE,
    JOINED,
    RECEIVED_MODEL,
    WAITED_FOR_MODEL,
    Action,
    ExecuteBatch,
    PushToHub,
    Status,
    Terminate,
    UnitStatus,
    action_response,
    batch_completed,
    error_status,
    sent_update,
)
from hypha.standin.actions.scheduler import (
    ActionScheduler,
    RunningMean,
    Simulation,
    simulate,
)

PS = "12D3KooWPs"
W1, W2, W3 = "12D3KooWw1", "12D3KooWw2", "12D3KooWw3"


class Clock:
    """Seconds since the scheduler's start, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def at_ms(self, ms: int) -> None:
        self.now = ms / 1000


def scheduler(
    target: int,
    rounds: int = 100,
    workers: tuple[tuple[str, int], ...] = (),
    parameter_server: str | None = PS,
    multi_batch_size: int = 3,
    push_destination: tuple[str, str] | None = None,
) -> tuple[ActionScheduler, Clock]:
    clock = Clock()
    s = ActionScheduler(
        target,
        rounds,
        parameter_server,
        clock=clock,
        wall=lambda: 1_700_000_000.0,
        multi_batch_size=multi_batch_size,
        push_destination=push_destination,
    )
    for peer, batch_size in workers:
        s.add_worker(peer, batch_size)
    return s, clock


def batch(batch_size: int, batches: int = 1) -> Status:
    return batch_completed(batch_size, batches)


def sent(round_: int) -> Status:
    return sent_update(round_, {})


APPLIED = APPLIED_UPDATE


def kind(action: Action) -> str:
    """The action's `kind` on the wire."""
    return str(action_response("job", action)["next"]["action"]["kind"])


# statistics.rs


def test_running_mean_update() -> None:
    mean = RunningMean()
    seen = []
    for time_ms in (1050, 1000, 1025, 2050):
        mean.update(time_ms, 1)
        seen.append((mean.samples, mean.value))
    assert seen == [(1, 1050), (2, 1025), (3, 1025), (4, 1281)]


def test_running_mean_weighted_update() -> None:
    mean = RunningMean()
    seen = []
    for time_ms, count in ((10, 1), (20, 2), (30, 3), (40, 4)):
        mean.update(time_ms, count)
        seen.append((mean.samples, mean.value))
    assert seen == [(1, 10), (3, 10), (6, 10), (10, 10)]


# simulation.rs


def test_simulation_hits_steps_cap() -> None:
    assert simulate([0, 0, 0], [10, 5, 1], [20, 30, 50], 9999, 3) == Simulation(
        60, 9999 - 41, [3, 2, 1], True
    )


def test_simulation_hits_update_target() -> None:
    assert simulate([0, 0, 0], [10, 5, 1], [20, 30, 50], 50, 999) == Simulation(
        80, -1, [4, 2, 1], False
    )


# batch_scheduler.rs, batch_scheduler_tests. Upstream's first four ask with a peer its empty
# pool does not hold; the stand-in's pool holds the asking worker, with no mean yet.


def test_train_idle_executes_batch() -> None:
    s, _ = scheduler(10, workers=((W1, 1),), parameter_server=None)
    assert s.answer(W1, IDLE) == ExecuteBatch(1)


def test_train_continues_batching_without_parameter_server() -> None:
    s, _ = scheduler(100, workers=((W1, 1),), parameter_server=None)
    assert s.answer(W1, batch(4, 3)) == ExecuteBatch(1)


def test_train_waits_without_parameter_server() -> None:
    s, _ = scheduler(10, workers=((W1, 1),), parameter_server=None)
    assert kind(s.answer(W1, batch(10))) == "idle"


def test_train_idle_respects_samples_remaining() -> None:
    s, _ = scheduler(0, workers=((W1, 1),), parameter_server=None)
    assert kind(s.answer(W1, IDLE)) == "idle"  # the round's target is met, and no PS


def test_final_round_applies_once_and_pushes_model() -> None:
    s, _ = scheduler(
        1,
        rounds=2,
        workers=((W1, 1), (W2, 1)),
        multi_batch_size=1,
        push_destination=("hf/repo", "token"),
    )
    for first, second in ((W2, W1), (W1, W2)):  # rounds 0 and 1
        assert kind(s.answer(first, batch(1))) in ("execute-batch", "send-update")
        assert s.answer(first, batch(1)).target.peers == [PS]
        assert kind(s.answer(first, sent(s.round))) == "idle"
        assert s.answer(second, batch(1)).target.peers == [PS]
        assert kind(s.answer(second, sent(s.round))) == "idle"
        assert s.senders() == [W1, W2]  # the parameter server aggregates both
        assert s.aggregated() == [W1, W2]  # and broadcasts to both
        s.broadcasted()
    # Completion.
    assert kind(s.answer(W1, IDLE)) in ("apply-update", "idle")
    assert kind(s.answer(W1, APPLIED)) == "idle"
    assert s.answer(W1, IDLE) == PushToHub("hf/repo", "token")
    assert s.answer(W1, UnitStatus(state="pushed-to-hub")) == Terminate()
    assert kind(s.answer(W2, IDLE)) in ("apply-update", "execute-batch", "terminate")
    assert kind(s.answer(W2, APPLIED)) == "idle"
    assert s.answer(W2, IDLE) == Terminate()
    assert [w.is_pusher for w in s.workers.values()] == [True, False]  # one pusher
    assert all(w.applied_final_update for w in s.workers.values())
    assert s.round == 2 and s.training_complete and s.push_done


def test_a_failed_push_asks_the_next_worker_and_all_failing_ends_the_job() -> None:
    """As upstream's scheduler: a pusher's error moves the push to the next worker that
    applied the final update; once every one has failed, every worker is terminated."""
    s, _ = scheduler(
        1, rounds=1, workers=((W1, 1), (W2, 1)), multi_batch_size=1,
        push_destination=("hf/repo", "token"),
    )  # fmt: skip
    for worker in (W1, W2):
        assert s.answer(worker, batch(1)).target.peers == [PS]
        assert kind(s.answer(worker, sent(s.round))) == "idle"
    s.aggregated()
    assert kind(s.answer(W1, IDLE)) == "apply-update"
    # Before the broadcast is over training seems to go on; W1 has the final model all the same.
    assert kind(s.answer(W1, APPLIED)) == "execute-batch"
    assert kind(s.answer(W2, IDLE)) == "apply-update"
    s.broadcasted()  # every worker that applied it has the final model
    assert kind(s.answer(W2, APPLIED)) == "idle"
    assert kind(s.answer(W1, batch(1))) == "idle"
    assert s.answer(W1, IDLE) == PushToHub("hf/repo", "token")
    assert kind(s.answer(W2, IDLE)) == "idle"  # one pusher at a time
    assert s.answer(W1, error_status("other", "pushing the model failed")) == Terminate()
    assert s.answer(W2, IDLE) == PushToHub("hf/repo", "token")  # the next one is asked
    assert s.answer(W2, error_status("other", "pushing the model failed")) == Terminate()
    assert not s.push_done
    assert s.answer(W1, IDLE) == Terminate()  # nobody is left who could push


def test_rejoining_worker_receives_model_before_participating() -> None:
    s, _ = scheduler(1, rounds=3, workers=((W1, 1), (W2, 1)), multi_batch_size=1)
    # Round 0: upstream's pool holds w2 from the start, yet only w1 reports; min_quorum 1
    # and no grace let the parameter server go with w1 alone.
    assert s.answer(W1, batch(1)).target.peers == [PS]
    assert kind(s.answer(W1, sent(0))) == "idle"
    s.aggregated()
    s.broadcasted()
    # w2 joins late.
    assert kind(s.answer(W2, JOINED)) == "wait-for-model"
    assert s.senders() == [W1]  # a worker waiting for the model is not waited for
    # Round 1, w1 producing the update.
    assert s.answer(W1, batch(1)).target.peers == [PS]
    assert kind(s.answer(W1, sent(1))) == "idle"
    s.aggregated()
    s.broadcasted()
    # w1 applies and sends the model to w2.
    assert kind(s.answer(W1, IDLE)) in ("apply-update", "idle", "execute-batch")
    send = s.answer(W1, APPLIED)
    assert kind(send) == "send-model" and send.target.peers == [W2]
    receive = s.answer(W2, WAITED_FOR_MODEL)
    assert kind(receive) == "receive-model" and receive.source.peers == [W1]
    assert kind(s.answer(W2, RECEIVED_MODEL)) == "idle"
    assert kind(s.answer(W2, IDLE)) in ("apply-update", "execute-batch")
    assert s.answer(W2, APPLIED) == ExecuteBatch(1)
    rejoined = s.workers[W2]
    assert not rejoined.waiting_for_model and rejoined.applied_update


def test_rejoining_parameter_server_resends_updates_before_broadcast() -> None:
    """Upstream's parameter server leaves after aggregating and rejoins under the same id:
    its record of who sent is gone, so both workers are asked to send again. The stand-in's
    parameter server never leaves; the replay drops its record as the pool does."""
    s, _ = scheduler(1, rounds=3, workers=((W1, 1), (W2, 1)), multi_batch_size=1)
    for peer in (W1, W2):
        assert s.answer(peer, batch(1)).target.peers == [PS]
        assert kind(s.answer(peer, sent(0))) == "idle"
    s.aggregated()
    s.sent.clear()  # the parameter server left; it rejoins with an empty record
    for peer in (W1, W2):
        assert s.answer(peer, batch(1)).target.peers == [PS]
        assert kind(s.answer(peer, sent(0))) == "idle"
    assert s.aggregated() == [W1, W2]
    s.broadcasted()
    assert s.round == 1


def test_handle_simple_two_rounds_simulation_drives_updates() -> None:
    """Upstream's steps and times. Its assertions compare only the variant of
    ExecutorAction (Train for every step), so the expected train actions here are those its
    scheduler code gives: `execute-batch` while the round's 800 samples are not in, then
    `send-update`; a `sent-update` is answered `idle`. Its test statistic (the time since the
    previous report, ignoring the batch count) stands in for the running mean."""
    s, clock = scheduler(800, rounds=10, workers=((W1, 150), (W2, 100), (W3, 50)))
    steps = [
        (W3, 50, 500, "execute-batch"),
        (W2, 100, 800, "execute-batch"),
        (W1, 150, 950, "execute-batch"),
        (W3, 50, 1000, "execute-batch"),
        (W3, 50, 1500, "execute-batch"),
        (W2, 100, 1600, "execute-batch"),
        (W1, 150, 1900, "execute-batch"),
        (W3, 50, 2000, "execute-batch"),
        (W2, 100, 2400, "send-update"),  # 800 samples: the target
    ]
    for peer, batch_size, at_ms, expected in steps:
        clock.at_ms(at_ms)
        assert kind(s.answer(peer, batch(batch_size))) == expected, (peer, at_ms)
    clock.at_ms(2450)
    for peer in (W1, W2, W3):
        assert kind(s.answer(peer, sent(0))) == "idle"
    assert s.senders() == [W1, W2, W3]
    assert s.aggregated() == [W1, W2, W3]
    s.broadcasted()
    assert s.target_samples - s.count == 800, "counter reset for new round"
    assert s.round == 1, "round advanced after broadcast"
    assert not s.sent, "sent updates cleared after broadcast"
    clock.at_ms(2600)
    for peer in (W1, W2, W3):
        assert s.answer(peer, APPLIED) == ExecuteBatch(1)


# The stand-in's own cases of section 4 that upstream's tests leave out.


def test_weights_are_upstreams_shares() -> None:
    """`batch-completed`'s numerator is the samples before that report plus one batch
    (not batches x batch); `idle`'s is the worker's samples; both over the round's count."""
    s, _ = scheduler(48, workers=((W1, 8), (W2, 8)))
    s.answer(W1, batch(8, 2))  # 16
    update = s.answer(W2, batch(8, 4))  # 32 more: 48, the target
    assert update.weight == pytest.approx((0 + 8) / 48)
    assert update.target.strategy.type == "One"
    assert s.answer(W1, IDLE).weight == pytest.approx(16 / 48)


def test_once_every_worker_has_a_mean_the_simulation_gives_batches_and_zero() -> None:
    s, clock = scheduler(1000, workers=((W1, 8), (W2, 8)))
    clock.at_ms(5)  # upstream times a report only from a clock past 0 ms
    s.answer(W1, batch(8))  # first reports only start the clocks
    s.answer(W2, batch(8))
    clock.at_ms(15)
    assert s.answer(W1, batch(8)) == ExecuteBatch(1)  # w2: no mean
    clock.at_ms(1005)
    # w2 at ~1 s a batch, w1 at 10 ms: w1 reaches 3 batches first, w2 gets none.
    assert s.answer(W2, batch(8)) == ExecuteBatch(0)
    counted = s.count
    assert s.answer(W2, batch(8, 0)).batches == 0  # batches 0: no samples, no time
    assert s.count == counted and s.workers[W2].mean.samples == 1
    assert s.answer(W1, batch(8, 2)).batches == 3


def test_a_failed_send_is_asked_again_and_errors_decide_as_upstream() -> None:
    s, _ = scheduler(8, workers=((W1, 8),))
    assert kind(s.answer(W1, batch(8))) == "send-update"
    # The send failed: no sent-update, so the worker is not recorded as having sent.
    assert kind(s.answer(W1, error_status("connection", "x"))) == "idle"
    assert kind(s.answer(W1, IDLE)) == "send-update"
    assert s.answer(W1, error_status("other", "x")) == Terminate()


def test_without_a_destination_the_first_to_apply_the_final_update_ends_the_job() -> None:
    s, _ = scheduler(8, rounds=1, workers=((W1, 8), (W2, 8)))
    s.answer(W1, batch(8))
    s.answer(W1, sent(0))
    s.aggregated()
    assert kind(s.answer(W2, IDLE)) == "apply-update"  # a straggler that never sent
    s.broadcasted()
    assert kind(s.answer(W1, APPLIED)) == "idle"
    assert s.answer(W1, IDLE) == Terminate()
    assert s.answer(W2, IDLE) == Terminate()
