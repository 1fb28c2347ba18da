"""The scheduler's clock as the worker's sees it (docs/protocol-actions.md, "Deadlines and
clock skew"): every deadline of the action protocol is an absolute SystemTime on the
scheduler's clock, and the executor waits, and its bridge times a receive, on the worker's.
Torch-free.

Upstream's train scheduler computes each deadline from one `SystemTime::now()` taken as it
starts handling the request, plus a fixed span (`crates/scheduler/src/scheduling/
rl_scheduler.rs`, `schedule()`, index id 66469012466): `idle` 500 ms (`short_idle`, also
`now + 500 ms` after the final `applied-update`), `idle{now}` after `sent-model` and
`received-model`, `wait-for-model` 1 s (`wait_model`), `apply-update` 10 s, `receive-model`
60 s (`long_io`). That `now` lies between our request leaving (t0, the worker's clock) and its
answer coming back (t1), so an answer meant `span` from then bounds the offset (the
scheduler's clock minus the worker's) as NTP bounds one (RFC 5905, section 8):

    deadline - span - t1  <=  offset  <=  deadline - span - t0

Only the short ones are read for it (`idle`, `wait-for-model`, whose spans are under a
second and fixed since the action protocol began); each is a sample, its midpoint the
offset and half its round trip the bound. The estimate is the sample of the smallest round
trip among the last WINDOW (RFC 5905's clock filter, section 10), so a slow answer (a
scheduler busy after taking its `now`, the bridge's own retries) does not move it; a sample
whose interval does not overlap the estimate's means the offset moved (a clock stepped) and
the older samples are dropped. Before any sample the offset is 0: the clocks are taken to
agree, as before.

Deadlines are then read on the worker's clock: a wait (`idle`, `wait-for-model`) ends at
`deadline - offset`, never later than the scheduler means by more than the bound; a receive
(`apply-update`, `receive-model`) at `deadline - offset + bound`, never before the
scheduler's deadline as far as its answers tell, so that neither skew shortens it nor, past
on the worker's clock, it is sent with a past deadline upstream's bridge would read as none
(`crates/worker/src/executor/bridge.rs`, `receive_subscribe`, index id 66437242790: the
timeout's `duration_since(SystemTime::now())` on the worker's clock, no timer when it is
past). The bridge runs on the executor's machine: its clock is the worker's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from hypha.accelerate_executor.protocol.actions.messages import (
    Action,
    ApplyUpdate,
    Idle,
    ReceiveModel,
    Status,
    WaitForModel,
)

# The spans upstream's scheduler means (module docstring): `idle` half a second, except its
# `idle{now}` after these statuses; `wait-for-model` a second.
IDLE_S = 0.5
IDLE_NOW_AFTER = frozenset({"sent-model", "received-model"})
WAIT_FOR_MODEL_S = 1.0
# How many of the latest samples the estimate is chosen from.
WINDOW = 8
# Above this (seconds, either way) the operator is told, once: other parts of Hypha may not
# read deadlines as tolerantly.
TELL_ABOVE_S = 2.0


@dataclass(frozen=True)
class Sample:
    """The offset's bounds from one answer: [low, high], seconds."""

    low: float
    high: float

    @property
    def offset(self) -> float:
        return (self.low + self.high) / 2

    @property
    def bound(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: Sample) -> bool:
        return self.low <= other.high and other.low <= self.high


def meant_span(answering: str, action: Action) -> float | None:
    """The span upstream's scheduler means by `action`'s deadline when it answers a status
    of state `answering`; None for an answer not read for the offset."""
    if isinstance(action, Idle):
        return 0.0 if answering in IDLE_NOW_AFTER else IDLE_S
    if isinstance(action, WaitForModel):
        return WAIT_FOR_MODEL_S
    return None


class SchedulerClock:
    """The estimate of the scheduler's clock offset, from the answers' round trips."""

    def __init__(self, window: int = WINDOW, tell_above_s: float = TELL_ABOVE_S) -> None:
        self.samples: deque[Sample] = deque(maxlen=window)
        self.tell_above_s = tell_above_s
        self._told = False
        self._note: str | None = None

    @property
    def estimate(self) -> Sample | None:
        """The sample the offset is read from: the smallest round trip in the window."""
        return min(self.samples, key=lambda s: s.high - s.low, default=None)

    @property
    def offset(self) -> float:
        """The scheduler's clock minus the worker's, seconds (0 before any sample)."""
        estimate = self.estimate
        return 0.0 if estimate is None else estimate.offset

    @property
    def bound(self) -> float:
        """How far the offset may be off, seconds: half the estimate's round trip."""
        estimate = self.estimate
        return 0.0 if estimate is None else estimate.bound

    def observe(self, deadline: float, span: float, sent: float, answered: float) -> None:
        """An answer meant `span` after the scheduler's now, read with the request sent at
        `sent` and its answer in at `answered` (the worker's time.time())."""
        if answered < sent:  # the worker's clock stepped back mid-way: nothing to read
            return
        sample = Sample(deadline - span - answered, deadline - span - sent)
        estimate = self.estimate
        if estimate is not None and not sample.overlaps(estimate):
            self.samples.clear()  # the offset moved: the older samples no longer hold
        self.samples.append(sample)
        self._consider_telling()

    def read(self, answering: Status, action: Action, sent: float, answered: float) -> Action:
        """`action`, the answer to `answering`, observed and its deadline on the worker's
        clock (module docstring)."""
        span = meant_span(answering.state, action)
        if span is not None and isinstance(action, Idle | WaitForModel):
            self.observe(action.deadline, span, sent, answered)
        match action:
            case Idle(deadline=at) | WaitForModel(deadline=at):
                return replace(action, deadline=at - self.offset)
            case ApplyUpdate(deadline=at) | ReceiveModel(deadline=at):
                return replace(action, deadline=at - self.offset + self.bound)
        return action

    def take_note(self) -> str | None:
        """The one line telling the operator of a large skew, once; None otherwise."""
        note, self._note = self._note, None
        return note

    def _consider_telling(self) -> None:
        offset, bound = self.offset, self.bound
        if self._told or abs(offset) - bound <= self.tell_above_s:
            return
        self._told = True
        way = "ahead of" if offset > 0 else "behind"
        self._note = (
            f"warning: the scheduler's clock is {abs(offset):.1f} s {way} this worker's "
            f"(+-{bound:.3f} s, from its answers' round trips); the executor reads every "
            "deadline through that offset, but other parts of Hypha may not: check the "
            "clocks' time sync (NTP)"
        )
