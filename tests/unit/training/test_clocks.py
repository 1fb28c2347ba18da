"""The loop's clocks (training/clocks.py): parts summed lap by lap, none lost."""

from __future__ import annotations

from hypha.accelerate_executor.training.clocks import Laps


def test_parts_named_up_front_are_there_in_order_and_laps_add_up() -> None:
    laps = Laps("step", "data", "statuses")
    assert list(laps.parts) == ["step", "data", "statuses"]
    assert set(laps.parts.values()) == {0.0}
    for part in ("data", "step", "statuses", "data", "sync"):
        sum(range(10_000))  # something to time
        laps.lap(part)
    assert list(laps.parts) == ["step", "data", "statuses", "sync"]
    assert all(seconds > 0 for seconds in laps.parts.values())
    # Each lap starts where the last ended: the parts cover the span, no more.
    assert sum(laps.parts.values()) <= laps.seconds
    assert laps.cpu_seconds >= 0


def test_a_part_taken_starts_over_and_the_running_lap_is_untouched() -> None:
    laps = Laps("training")
    sum(range(10_000))
    laps.lap("training")
    laps.lap("other")
    trained = laps.parts["training"]
    assert laps.take("training") == trained > 0
    assert laps.parts["training"] == 0.0
    assert laps.take("never lapped") == 0.0
    # The lap in progress counts from the last lap, not from the start.
    assert 0 <= laps.since_lap < laps.seconds
