"""The scheduler's clock offset, estimated from the answers' round trips (bridge/
scheduler_clock.py): what each answer bounds, which sample is kept, how every deadline is
read on the worker's clock, and the one line a large skew earns. No process, no bridge."""

from __future__ import annotations

import pytest

from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
from hypha.accelerate_executor.protocol.actions.messages import (
    APPLIED_UPDATE,
    IDLE,
    JOINED,
    RECEIVED_MODEL,
    SENT_MODEL,
    WAITED_FOR_MODEL,
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    ReceiveModel,
    Terminate,
    WaitForModel,
)
from hypha.accelerate_executor.protocol.job import Strategy
from hypha.accelerate_executor.training.actions.scheduler_clock import (
    IDLE_S,
    WAIT_FOR_MODEL_S,
    WINDOW,
    Sample,
    SchedulerClock,
)

T = 1.8e9  # the worker's time.time() at the first request
PS = ActionPeersReference(type="peers", peers=["12D3KooWPs"], strategy=Strategy(type="All"))


def answer_idle(
    clock: SchedulerClock, skew: float, sent: float, rtt: float, at: float = 0.5
) -> Idle:
    """An `idle{now + IDLE_S}` taken by a scheduler `skew` ahead, `at` of the way through a
    round trip of `rtt` s sent at `sent`; the action as the executor reads it."""
    scheduler_now = sent + at * rtt + skew
    action = clock.read(IDLE, Idle(scheduler_now + IDLE_S), sent, sent + rtt)
    assert isinstance(action, Idle)
    return action


@pytest.mark.parametrize("skew", [-300.0, -70.0, -2.0, 0.0, 2.0, 15.0, 70.0, 300.0])
def test_an_idle_lasts_as_the_scheduler_means_it_whatever_the_skew(skew: float) -> None:
    clock = SchedulerClock()
    action = answer_idle(clock, skew, T, rtt=0.02)
    assert clock.offset == pytest.approx(skew, abs=1e-6)
    assert clock.bound == pytest.approx(0.01)
    # Half a second from the scheduler's now, which was mid-way through the round trip.
    assert action.deadline == pytest.approx(T + 0.01 + IDLE_S, abs=1e-6)


def test_each_answer_bounds_the_offset_by_its_round_trip() -> None:
    clock = SchedulerClock()
    # The scheduler took its now at the very start of the round trip: the truth is the high
    # end of the sample, within its bound of the midpoint.
    answer_idle(clock, 15.0, T, rtt=0.2, at=0.0)
    sample = clock.estimate
    assert sample == Sample(pytest.approx(14.8), pytest.approx(15.0))  # type: ignore[arg-type]
    assert sample is not None and sample.low <= 15.0 <= sample.high
    assert abs(clock.offset - 15.0) <= clock.bound + 1e-9


def test_the_smallest_round_trip_of_the_window_is_kept() -> None:
    clock = SchedulerClock()
    answer_idle(clock, 70.0, T, rtt=0.01)
    # Slow answers (a busy scheduler after its now, the bridge's own retries) with their now
    # late in the round trip: they overlap the estimate and do not move it.
    for i in range(WINDOW - 1):
        answer_idle(clock, 70.0, T + 1 + i, rtt=0.5, at=0.9)
    assert clock.offset == pytest.approx(70.0, abs=0.006)
    # Once the good sample is out of the window, the best of the rest.
    answer_idle(clock, 70.0, T + 10, rtt=0.1)
    assert clock.bound == pytest.approx(0.05)
    assert clock.offset == pytest.approx(70.0, abs=0.05)


def test_a_stepped_clock_drops_the_older_samples() -> None:
    clock = SchedulerClock()
    for i in range(4):
        answer_idle(clock, 15.0, T + i, rtt=0.01)
    # The worker's clock is stepped 15 s forward (NTP caught up): the next sample does not
    # overlap, and the offset is read from it alone, at once.
    answer_idle(clock, 0.0, T + 20, rtt=0.05)
    assert len(clock.samples) == 1
    assert clock.offset == pytest.approx(0.0, abs=0.03)


def test_a_worker_clock_that_steps_back_mid_request_is_no_sample() -> None:
    clock = SchedulerClock()
    clock.read(IDLE, Idle(T + 5), T, T - 1)
    assert not clock.samples and clock.offset == 0.0


def test_what_each_answer_means_idle_now_and_wait_for_model() -> None:
    for status in (SENT_MODEL, RECEIVED_MODEL):  # upstream's idle{timeout: now}
        clock = SchedulerClock()
        clock.read(status, Idle(T + 0.01 + 15), T, T + 0.02)
        assert clock.offset == pytest.approx(15.0)
    clock = SchedulerClock()
    for status in (JOINED, WAITED_FOR_MODEL):
        clock.read(status, WaitForModel(T + 0.01 - 70 + WAIT_FOR_MODEL_S), T, T + 0.02)
        assert clock.offset == pytest.approx(-70.0)
    # Answers whose span is long or none are read through the estimate, not for it.
    clock = SchedulerClock()
    for action in (ApplyUpdate(PS, T + 999), ReceiveModel(PS, T + 999), ExecuteBatch(1)):
        clock.read(IDLE, action, T, T + 0.02)
    assert not clock.samples


@pytest.mark.parametrize("skew", [-300.0, -70.0, 0.0, 15.0, 300.0])
def test_a_receive_never_closes_before_the_schedulers_deadline(skew: float) -> None:
    """apply-update's 10 s and receive-model's 60 s, on the worker's clock: their meant
    length, plus the bound, so never before the scheduler's deadline; never in the past, so
    never sent as `none` to upstream's bridge."""
    clock = SchedulerClock()
    answer_idle(clock, skew, T, rtt=0.04, at=0.0)  # the estimate is 0.02 s below the truth
    answered = T + 1.04
    for span, make in ((10.0, ApplyUpdate), (60.0, ReceiveModel)):
        scheduler_now = T + 1 + skew
        action = clock.read(APPLIED_UPDATE, make(PS, scheduler_now + span), T + 1, answered)
        assert isinstance(action, ApplyUpdate | ReceiveModel)
        truth = scheduler_now + span - skew  # the deadline as the scheduler means it, ours
        assert truth <= action.deadline <= truth + 2 * clock.bound + 1e-9
        assert action.deadline > answered + span - 0.1


def test_before_any_sample_the_clocks_are_taken_to_agree() -> None:
    clock = SchedulerClock()
    action = clock.read(IDLE, ApplyUpdate(PS, T + 10), T, T + 0.01)
    assert action == ApplyUpdate(PS, T + 10)
    assert clock.read(IDLE, Terminate(), T, T) == Terminate()
    assert clock.take_note() is None


@pytest.mark.parametrize(("skew", "way"), [(15.0, "ahead of"), (-70.0, "behind")])
def test_a_large_skew_is_told_once_in_one_line(skew: float, way: str) -> None:
    clock = SchedulerClock()
    for i in range(5):
        answer_idle(clock, skew, T + i, rtt=0.01)
    note = clock.take_note()
    assert note is not None and "\n" not in note
    assert f"the scheduler's clock is {abs(skew):.1f} s {way} this worker's" in note
    answer_idle(clock, skew, T + 9, rtt=0.01)
    assert clock.take_note() is None


def test_a_skew_within_the_limit_or_its_bound_is_not_told() -> None:
    clock = SchedulerClock()
    answer_idle(clock, 1.9, T, rtt=0.01)
    assert clock.take_note() is None
    clock = SchedulerClock()
    answer_idle(clock, 2.5, T, rtt=2.0)  # 2.5 +- 1: it may be 1.5
    assert clock.take_note() is None
