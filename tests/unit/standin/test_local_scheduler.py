"""The stand-in's scheduler decides as upstream's batch scheduler does: its projection, its
running mean, its states, and its slice tracker's affinity. Figures are upstream's own
test cases (simulation.rs, statistics.rs, batch_scheduler.rs, tracker/slice.rs)."""

from __future__ import annotations

import pytest

from hypha.accelerate_executor.protocol.alpha17.messages import Continue, Done, Ok, ScheduleUpdate
from hypha.standin.alpha17.scheduler import (
    BatchScheduler,
    Projection,
    RunningMean,
    project,
)
from hypha.standin.data_service.service import SliceTracker
from hypha.standin.errors import ProgressError


class Clock:
    """A clock the test moves: seconds since its start."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000


@pytest.mark.parametrize(
    ("to_go", "time_cap_ms", "steps_cap", "expected"),
    [
        (9999, 101, 999, Projection(100, 9999 - 67, [5, 3, 2], True)),  # the time cap
        (9999, 999, 3, Projection(60, 9999 - 41, [3, 2, 1], True)),  # the steps cap
        (50, 999, 999, Projection(80, 0, [4, 2, 1], False)),  # the target
        (0, 10_000, 3, Projection(0, 0, [0, 0, 0], False)),  # reached already
    ],
)
def test_projection(to_go, time_cap_ms, steps_cap, expected):
    assert project([0, 0, 0], [10, 5, 1], [20, 30, 50], to_go, time_cap_ms, steps_cap) == expected


def test_running_mean_in_whole_milliseconds():
    mean = RunningMean()
    values = []
    for sample in (1050, 1000, 1025, 2050):
        mean.update(sample)
        values.append(mean.value)
    assert values == [1050, 1025, 1025, 1281]


def test_two_rounds_of_three_workers():
    clock = Clock()
    scheduler = BatchScheduler(samples_per_round=800, rounds=2, clock=clock)
    for peer, batch in (("w1", 150), ("w2", 100), ("w3", 50)):
        scheduler.add_worker(peer, batch)
    steps = [
        ("w3", 50, 500, Continue()),
        ("w2", 100, 300, Continue()),
        ("w1", 150, 150, Continue()),
        ("w3", 50, 50, ScheduleUpdate(2)),
        ("w3", 50, 500, Continue()),
        ("w2", 100, 100, ScheduleUpdate(1)),
        ("w1", 150, 300, ScheduleUpdate(0)),
        ("w3", 50, 100, Continue()),
        ("w2", 100, 100, Continue()),
    ]
    for peer, samples, after_ms, answer in steps:
        clock.advance_ms(after_ms)
        assert scheduler.status(peer, samples) == answer, (peer, clock.now)
    for peer in ("w1", "w2", "w3"):
        assert scheduler.update(peer) == Ok()
    with pytest.raises(ProgressError, match="status while updating"):
        scheduler.status("w1", 150)
    scheduler.updated()
    assert [scheduler.update_received(p) for p in ("w1", "w2", "w3")] == [Continue()] * 3
    assert (scheduler.count, scheduler.round) == (800, 1)
    scheduler.updated()
    assert scheduler.update_received("w1") == Done()
    with pytest.raises(ProgressError, match="status while done"):
        scheduler.status("w1", 150)


def test_a_round_past_the_time_cap_ends_at_the_target():
    # Slow batches (6 s each): no projection ends within 10 s of the round's start, so the
    # round runs until its target is reached, and that status gets ScheduleUpdate{0}.
    clock = Clock()
    scheduler = BatchScheduler(samples_per_round=1800, rounds=1, clock=clock)
    scheduler.add_worker("a", 600)
    answers = []
    for _ in range(3):
        clock.advance_ms(6000)
        answers.append(scheduler.status("a", 600))
    assert answers == [Continue()] * 2 + [ScheduleUpdate(0)]


def test_a_worker_yet_to_report_is_projected_as_instant():
    # Upstream's running mean starts at 0 ms: until a worker's first status, the projection
    # has it finish batches at once, so a target it could cover ends the round early.
    clock = Clock()
    scheduler = BatchScheduler(samples_per_round=1200, rounds=1, clock=clock)
    scheduler.add_worker("a", 600)
    scheduler.add_worker("b", 600)
    clock.advance_ms(6000)
    assert scheduler.status("a", 600) == ScheduleUpdate(0)


def test_a_worker_that_left_is_no_longer_projected():
    clock = Clock()
    scheduler = BatchScheduler(samples_per_round=40, rounds=1, clock=clock)
    scheduler.add_worker("a", 10)
    scheduler.add_worker("b", 10)
    clock.advance_ms(100)
    # 30 samples to go: with b, two batches each would be projected (a ScheduleUpdate{2});
    # a alone needs 3, the steps cap.
    scheduler.remove_worker("b")
    assert scheduler.status("a", 10) == Continue()
    with pytest.raises(ProgressError, match="no worker b"):
        scheduler.status("b", 10)


def test_slices_keep_their_worker_across_passes():
    tracker = SliceTracker(list(range(7)))
    first = [tracker.next(peer) for peer in ("p1", "p2") * 3 + ("p1",)]
    assert first == [0, 1, 2, 3, 4, 5, 6]
    # The next pass: each worker gets its own slices again, the same indices.
    assert [tracker.next("p2"), tracker.next("p1")] == [1, 0]
    assert tracker.passes == 1


def test_a_fast_worker_steals_from_the_slow_one():
    tracker = SliceTracker(list(range(7)))
    assert [tracker.next(p) for p in ("p1", "p1", "p1", "p2", "p1", "p1", "p1")] == list(range(7))
    assert [tracker.next(p) for p in ("p2", "p1", "p1", "p1")] == [3, 0, 1, 2]
    rest = {tracker.next("p2"), tracker.next("p1"), tracker.next("p1")}
    assert rest == {4, 5, 6}
    assert [tracker.next("p1"), tracker.next("p2")] == [0, 3]
    assert tracker.passes == 2


def test_a_departed_workers_slices_go_to_others():
    tracker = SliceTracker(list(range(7)))
    assert [tracker.next(p) for p in ("p1", "p2") * 3 + ("p1",)] == list(range(7))
    tracker.forget("p1")
    assert tracker.next("p3") == 0
    assert [tracker.next(p) for p in ("p2", "p3", "p2", "p3")] == [1, 2, 3, 4]


def test_statuses_in_flight_past_schedule_update_are_overshoot_not_violations(make_coordinator):
    """Statuses go out concurrently (up to 8 in flight): those the scheduler handles after
    its ScheduleUpdate get Continue, as upstream answers them, and count as overshoot in the
    summary; a status while the update is in flight is an Error, as upstream's."""
    clock = Clock()
    coordinator = make_coordinator(clock=clock, workers=1, rounds=1, steps_per_round=2)
    job = coordinator.assign_job("w1")["job_id"]
    status = {"status": {"batch_size": 8}}
    answers = []
    for _ in range(4):
        clock.advance_ms(100)
        answers.append(coordinator.status(job, status))
    assert answers == [{"type": "ScheduleUpdate", "counter": 1}] + [{"type": "Continue"}] * 3
    metrics = {"metrics": {"round": 1, "metrics": {"loss": 1.0, "batches": 4.0}}}
    assert coordinator.status(job, metrics) == {"type": "Ok"}
    assert coordinator.status(job, "update") == {"type": "Ok"}
    record = coordinator.summary()["workers"]["w1"]
    assert (record["overshoot"], record["violations"]) == (2, [])
    assert record["batches_reported"] == record["batches_trained"] == 4
    assert coordinator.status(job, status) == {"type": "Error"}
    assert coordinator.summary()["workers"]["w1"]["violations"] == ["status while updating"]
