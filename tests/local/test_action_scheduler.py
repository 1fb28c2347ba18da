"""The stand-in's action-era scheduler answers as docs/protocol-actions.md section 4 says."""

from __future__ import annotations

from typing import Any

from hypha.accelerate_executor.local.action_scheduler import ActionScheduler

PS = "12D3KooWPs"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scheduler(workers: int = 2, target: int = 32, rounds: int = 2) -> tuple[ActionScheduler, Clock]:
    clock = Clock()
    s = ActionScheduler(target, rounds, PS, clock=clock, wall=lambda: 1_700_000_000.0)
    for index in range(workers):
        s.add_worker(f"w{index}", 8)
    return s, clock


def batch(batches: int) -> dict[str, Any]:
    return {"state": "batch-completed", "batch_size": 8, "batches": batches}


def test_a_first_round_from_join_to_send_update_with_weights() -> None:
    s, clock = scheduler()
    assert s.answer("w0", {"state": "joined"})["kind"] == "idle"
    assert s.answer("w0", {"state": "idle"}) == {"kind": "execute-batch", "batches": 1}
    # One batch each times nobody yet (the first report only resets the clock).
    assert s.answer("w0", batch(1))["batches"] == 1
    assert s.answer("w1", batch(1))["batches"] == 1
    clock.now += 0.1
    assert s.answer("w0", batch(1))["batches"] == 1  # w1 has no time yet
    clock.now += 0.2
    answer = s.answer("w1", batch(1))  # 32 samples: the target
    assert answer["kind"] == "send-update"
    assert answer["weight"] == 16 / 32  # its share of the round's samples
    assert s.answer("w1", {"state": "idle"})["kind"] == "idle"  # sent already
    sent = s.answer("w0", {"state": "idle"})
    assert sent["kind"] == "send-update" and sent["weight"] == 16 / 32
    assert sent["target"]["peers"] == [PS]


def test_the_simulation_can_give_a_slow_worker_zero_batches() -> None:
    s, clock = scheduler(target=1000)
    s.answer("w0", batch(1))
    s.answer("w1", batch(1))
    clock.now += 0.01
    s.answer("w0", batch(1))  # w0: 10 ms a batch
    clock.now += 1.0
    assert s.answer("w1", batch(1))["batches"] == 0  # w1 at 1 s a batch: w0 reaches 3 first
    # batches 0 only resets the clock, and samples nothing.
    before = s.round_samples
    s.answer("w1", batch(0))
    assert s.round_samples == before


def test_broadcast_brings_apply_update_then_the_next_round_and_the_end() -> None:
    s, _ = scheduler(workers=2, target=16, rounds=1)
    s.answer("w0", batch(1))
    assert s.answer("w1", batch(1))["kind"] == "send-update"
    assert s.answer("w0", {"state": "idle"})["kind"] == "send-update"
    assert s.senders() == ["w0", "w1"]
    s.broadcasted()
    apply = s.answer("w0", {"state": "idle"})
    assert apply["kind"] == "apply-update" and apply["source"]["strategy"] == {"type": "All"}
    # A straggler is told to apply whether it sent or not; the first to apply the final
    # update ends it, and every idle after that is told to terminate.
    assert s.answer("w0", {"state": "applied-update"}) == {"kind": "terminate"}
    assert s.answer("w1", {"state": "idle"}) == {"kind": "terminate"}


def test_errors_and_the_late_joiner() -> None:
    s, _ = scheduler(workers=1, target=8, rounds=3)
    assert (
        s.answer("w0", {"state": "error", "type": "connection", "message": "x"})["kind"] == "idle"
    )
    assert s.answer("w0", {"state": "error", "type": "other", "message": "x"}) == {
        "kind": "terminate"
    }
    s.answer("w0", batch(1))
    s.broadcasted()
    s.add_worker("late", 8)
    assert s.answer("late", {"state": "joined"})["kind"] == "wait-for-model"
    assert s.answer("late", {"state": "waited-for-model"})["kind"] == "wait-for-model"
    send = s.answer("w0", {"state": "applied-update"})
    assert send["kind"] == "send-model" and send["target"]["peers"] == ["late"]
    receive = s.answer("late", {"state": "waited-for-model"})
    assert receive["kind"] == "receive-model" and receive["source"]["peers"] == ["w0"]
    assert s.answer("late", {"state": "received-model"})["kind"] == "idle"
    assert s.senders() == ["w0", "late"]
