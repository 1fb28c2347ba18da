"""A round's decisions: status answers to a typed decision, statuses sent one per batch,
concurrently and in order, and the LR schedules the job names."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hypha.accelerate_executor.bridge.client import BridgeClient
from hypha.accelerate_executor.errors import BridgeError, SchedulerError
from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    Done,
    Error,
    Ok,
    SchedulerAnswer,
    ScheduleUpdate,
    parse_answer,
)
from hypha.accelerate_executor.protocol.job import LinearWithWarmup, WarmupStableDecay
from hypha.accelerate_executor.training.alpha17.loop import TRAIN_ON, Decision, scheduler_decision
from hypha.accelerate_executor.training.alpha17.status_reporter import StatusAnswer, StatusReporter
from hypha.accelerate_executor.training.optimization import build_lr_schedule
from unix_http import QuietHandler, serving


def answers(*pairs: tuple[int, SchedulerAnswer]) -> list[StatusAnswer]:
    """Answers in the order given, as they came."""
    seen = 0
    came = []
    for batch, answer in pairs:
        seen = max(seen, batch)
        came.append(StatusAnswer(answer, batch, seen))
    return came


CONTINUE = {"type": "Continue"}


@pytest.mark.parametrize(
    ("wire", "parsed"),
    [
        ({"type": "Continue"}, Continue()),
        ({"type": "ScheduleUpdate", "counter": 12}, ScheduleUpdate(12)),
        ({"type": "ScheduleUpdate", "counter": 0}, ScheduleUpdate(0)),
        ({"type": "Done"}, Done()),
        ({"type": "Error"}, Error()),
        ({"type": "Ok"}, Ok()),
    ],
)
def test_answers_are_parsed_once_into_typed_values(
    wire: dict[str, object], parsed: SchedulerAnswer
) -> None:
    assert parse_answer(wire) == parsed


@pytest.mark.parametrize(
    "wire",
    [
        {"type": "Later"},
        {"kind": "Continue"},
        {"type": "ScheduleUpdate"},
        {"type": "ScheduleUpdate", "counter": -1},
        {"type": "ScheduleUpdate", "counter": 2.5},
    ],
)
def test_an_answer_that_is_none_of_them_is_a_scheduler_error(wire: dict[str, object]) -> None:
    with pytest.raises(SchedulerError):
        parse_answer(wire)


def test_an_answer_that_is_not_an_object_is_a_bridge_error() -> None:
    with pytest.raises(BridgeError, match="not a scheduler answer"):
        parse_answer(["Continue"])


def test_no_answer_or_continue_trains_on() -> None:
    assert scheduler_decision([], TRAIN_ON) == TRAIN_ON
    assert scheduler_decision(answers((1, Continue()), (2, Continue())), TRAIN_ON) == TRAIN_ON


def test_schedule_update_names_the_batch_to_synchronise_after() -> None:
    assert scheduler_decision(answers((7, ScheduleUpdate(2))), TRAIN_ON) == Decision(9)
    # The batch it answers was the last.
    assert scheduler_decision(answers((7, ScheduleUpdate(0))), TRAIN_ON) == Decision(7)


def test_statuses_that_overtook_the_answered_one_count_as_seen() -> None:
    # The scheduler handled batch 8's status before batch 7's, and answered 7's counting both.
    pending = answers((8, Continue()), (7, ScheduleUpdate(2)))
    assert scheduler_decision(pending, TRAIN_ON) == Decision(10)


def test_a_later_schedule_update_does_not_move_the_round_end() -> None:
    first = scheduler_decision(answers((7, ScheduleUpdate(1))), TRAIN_ON)
    assert isinstance(first, Decision)
    later = scheduler_decision(answers((8, ScheduleUpdate(3))), first)
    assert later == first


def test_done_wins_over_everything() -> None:
    pending = answers((3, ScheduleUpdate(1)), (4, Done()))
    assert scheduler_decision(pending, TRAIN_ON) == Done()


@pytest.mark.parametrize("answer", [Error(), Ok()])
def test_an_unexpected_answer_is_a_scheduler_error(answer: SchedulerAnswer) -> None:
    with pytest.raises(SchedulerError, match="'status'; expected Continue or ScheduleUpdate"):
        scheduler_decision(answers((1, answer)), TRAIN_ON)


def test_decisions_are_frozen_values() -> None:
    with pytest.raises(AttributeError):
        TRAIN_ON.last_batch = 3  # type: ignore[misc]


def lrs(schedule: object, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()  # type: ignore[attr-defined]
    return rates


def test_linear_schedule_warms_up_then_falls_to_zero() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    spec = LinearWithWarmup(type="linear-with-warmup", warmup_steps=2, training_steps=6)
    rates = lrs(build_lr_schedule(optimizer, spec), optimizer, 7)
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_wsd_schedule_warms_up_from_the_floor_decays_and_holds_it() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    spec = WarmupStableDecay(type="wsd", warmup_steps=2, decay_steps=4)
    rates = lrs(build_lr_schedule(optimizer, spec), optimizer, 10)
    assert rates[:3] == pytest.approx([0.1, 0.55, 1.0])  # transformers warms up from the floor
    assert rates[3] > rates[4] > rates[5] > 0.1  # decaying right away, no stable phase
    assert rates[6:] == pytest.approx([0.1] * 4)  # 10% of the peak from then on


def test_no_schedule_keeps_the_rate() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    assert lrs(build_lr_schedule(optimizer, None), optimizer, 4) == pytest.approx([0.3] * 4)


@pytest.fixture
def slow_bridge(short_tmp: Path) -> Iterator[tuple[Path, list[int]]]:
    """A bridge that answers each status after a random delay, the first four only once
    four are open at the same time; records the order the statuses arrive in."""
    arrived: list[int] = []
    four_at_once = threading.Barrier(4, timeout=30)

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            progress = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            number = progress["status"]["batch_size"]
            arrived.append(number)
            if number <= 4:
                four_at_once.wait()  # breaks, and so fails the test, if statuses queue
            time.sleep(random.uniform(0.0, 0.02))
            self.reply_json(CONTINUE)

    with serving(short_tmp / "bridge.sock", Handler):
        yield short_tmp, arrived


def test_statuses_go_out_one_per_batch_and_concurrently(
    slow_bridge: tuple[Path, list[int]],
) -> None:
    work_dir, arrived = slow_bridge
    reporter = StatusReporter(BridgeClient(work_dir / "bridge.sock", work_dir))
    for batch in range(1, 31):
        reporter.batch_done(batch, samples=batch)  # samples tell the statuses apart
    answered = reporter.flush()
    reporter.close()
    assert sorted(a.batch for a in answered) == list(range(1, 31))
    assert all(a.answer == Continue() for a in answered)
    # One per batch, none merged. (The order they are handled in is the server's threads'.)
    assert sorted(arrived) == list(range(1, 31))
