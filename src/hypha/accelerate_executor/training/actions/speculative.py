"""The speculative step (docs/protocol-actions.md, "The speculative step"): the next batch's
forward and backward run while the scheduler's answer to a status is on its way, and the
optimizer steps on that gradient only when the answer is `execute-batch`.

Every batch of the action protocol waits for a round trip to a remote scheduler; a loop that
blocks on it leaves the device idle for the whole trip. Here the trip runs on a thread of
its own and this thread computes meanwhile (torch releases the GIL in its kernels, and
CUDA and accelerate stay on the thread they started on). The arithmetic is the blocking
loop's: the gradient is computed from the same weights on the same batch, and stepped on
exactly as `MicroBatchedStep` steps. An answer that trains nothing drops it: the gradient is
zeroed, the random state and the model's buffers (BatchNorm's statistics) are put back as
they were before the forward, and the batch is kept as the next one trained, so data order
and random draws are the blocking loop's. A dropped backward has still run its gradient
collective, on every rank alike, so the ranks stay in step.

Off where a gradient cannot be dropped: DeepSpeed's engine steps inside its backward, and
Megatron-LM's and XLA's do not run through MicroBatchedStep's backward as plain torch does.

Whether it pays depends on the host and the scheduler, not on the model alone: a lone
executor on a CPU gains up to 1.7x from it, a GPU whose queue already hides the round trip
about 1 %, and two executors on the same two cores lose up to a third (the gradient computed
ahead takes a core the other's step or the bridge needed), besides the gradient dropped after
each answer that trains nothing. So `auto` (the default) measures it where it runs:
`AutoSpeculation` tries both ways in turns and speculates only where that pays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from hypha.accelerate_executor.training.data import Batch
    from hypha.accelerate_executor.training.steps import MicroBatchedStep

T = TypeVar("T")

# Only where accelerate's backward is torch's: its own under these couples backward and step.
_CANNOT_DROP = {
    "DEEPSPEED": "DeepSpeed's engine steps the optimizer inside its backward",
    "MEGATRON_LM": "Megatron-LM's engine steps the optimizer inside its own train step",
    "XLA": "XLA's lazy graph joins the backward to the step that follows it",
}


def cannot_drop(accelerator: Accelerator) -> str | None:
    """Why this accelerate configuration cannot drop a computed gradient; None when it can."""
    return _CANNOT_DROP.get(accelerator.distributed_type.value)


@dataclass
class _Ahead:
    """A gradient computed ahead: its batch and loss, and what to restore if it is dropped."""

    batch: Batch
    loss: torch.Tensor
    rng: list[torch.Tensor]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]  # (buffer, its value before the forward)


class SpeculativeStep:
    def __init__(
        self,
        step: MicroBatchedStep,
        model: torch.nn.Module,
        device: torch.device,
        next_batch: Callable[[], Batch],
    ) -> None:
        self._step = step
        self._device = device
        self._next_batch = next_batch
        self._model = model
        self._ahead: _Ahead | None = None
        self._kept: Batch | None = None  # a dropped gradient's batch: the next one trained
        self._asker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hypha-action")
        self.used = self.dropped = 0

    def while_computing(self, ask: Callable[[], T]) -> T:
        """`ask()` on a thread while this thread computes the next batch's gradient; its
        answer. `settle` must follow before anything else touches the model."""
        pending = self._asker.submit(ask)
        self._compute()
        return pending.result()

    def settle(self, trains: bool) -> None:
        """Keeps the gradient for `stepped` when the answer `trains`; otherwise drops it."""
        if not trains and self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._step.drop()
            self._set_rng(ahead.rng)
            for buffer, before in ahead.buffers:
                buffer.copy_(before)
            self._kept = ahead.batch
            self.dropped += 1

    def stepped(self) -> torch.Tensor | None:
        """The optimizer step on the gradient computed ahead, and its loss; None when there
        is none."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        self._step.apply()
        self.used += 1
        return ahead.loss

    def next_batch(self) -> Batch:
        """The batch a dropped gradient was computed on, else the data's next."""
        kept, self._kept = self._kept, None
        return kept if kept is not None else self._next_batch()

    def tally(self) -> str:
        return f"{self.used} gradient(s) computed ahead used, {self.dropped} dropped"

    def close(self) -> None:
        self._asker.shutdown(wait=False)

    def _compute(self) -> None:
        assert self._ahead is None, "a gradient computed ahead was neither stepped nor dropped"
        batch = self.next_batch()
        rng = self._get_rng()
        buffers = [(buffer, buffer.clone()) for buffer in self._persistent_buffers()]
        loss = self._step.gradients(batch)
        self._ahead = _Ahead(batch, loss, rng, buffers)

    def _persistent_buffers(self) -> list[torch.Tensor]:
        """What a forward may change besides the gradient: running statistics. Looked up
        each time, since loading weights may replace them; non-persistent buffers (attention
        masks) are constants."""
        return [
            buffer
            for module in self._model.modules()
            for name, buffer in module._buffers.items()
            if buffer is not None and name not in module._non_persistent_buffers_set
        ]

    def _get_rng(self) -> list[torch.Tensor]:
        import torch

        states = [torch.get_rng_state()]
        if self._device.type == "cuda":
            states.append(torch.cuda.get_rng_state(self._device))
        return states

    def _set_rng(self, states: list[torch.Tensor]) -> None:
        import torch

        torch.set_rng_state(states[0])
        if self._device.type == "cuda":
            torch.cuda.set_rng_state(states[1], self._device)


# AutoSpeculation's schedule, in turns of TURN_CYCLES batch cycles: a turn awaiting each
# answer to warm up (compilation, caches), then a trial of four turns (off, on, off, on: each
# way twice, so that a trend in the host's load falls on both), then the chosen way for
# HOLD_TURNS turns, then a trial again (the host may have changed: another job started beside
# this one). 16 cycles in every 224 run the way not chosen.
TURN_CYCLES = 8
TRIAL = (False, True, False, True)
HOLD_TURNS = 24
# Speculating is kept only where it pays: measurably, by this much. Where it pays it pays
# plainly (a lone executor on a CPU: 1.2-1.7x); a GPU whose queue hides the round trip gains
# about 1 %, less than one trial's noise, and awaiting each answer is the loop upstream runs.
PAYS = 1.05


@dataclass
class _Turn:
    speculate: bool
    timed: bool  # a trial's turn: its cycles are timed


class AutoSpeculation:
    """`auto`: speculating and awaiting each answer tried in turns, and speculating kept until
    the next trial where it trained PAYS times the batches a second, awaiting otherwise.

    A batch cycle starts from a status that usually leads to a batch (`batch-completed`,
    `applied-update`, `received-model`); turns count them. What is timed: every cycle's wait
    for its answer, and its doing unless it is a transfer (a send, a receive) or the idle wait
    for the aggregate of an update sent, which are the same either way and seconds long. So
    the figure holds what speculating changes: the round trip hidden or not, a gradient
    computed ahead and dropped, a core shared with another executor, a GPU queue that hides
    the trip by itself, and the scheduler's own answers: reports that come at other times
    draw more or fewer `execute-batch{0}` (measured: 15 in a run awaiting, 351 speculating, in
    one pool), each a wait.

    Every rank counts the same cycles, since every rank sees the same actions; only rank 0's
    measure decides, through `share`, so every rank speculates alike."""

    def __init__(self, share: Callable[[bool], bool], say: Callable[[str], None]) -> None:
        self._share, self._say = share, say
        self._turns = self._schedule()
        self._turn = next(self._turns)
        self._cycles = 0  # of the current turn
        self._seconds = {True: 0.0, False: 0.0}
        self._batches = {True: 0, False: 0}
        self._kept: bool | None = None  # the last trial's choice
        self.trials = self.chose_on = 0

    @property
    def speculate(self) -> bool:
        """Whether the coming batch cycle computes a gradient ahead."""
        return self._turn.speculate

    @property
    def closes_turn(self) -> bool:
        """Whether the coming batch cycle is its turn's last and is timed: a device that runs
        ahead of the host is waited for before its end, so no turn's work spills into the
        next's time."""
        return self._turn.timed and self._cycles == TURN_CYCLES - 1

    def cycle_ended(self, seconds: float, batches: int, batch_cycle: bool) -> None:
        """A cycle's timed `seconds`, in which it trained `batches`; a batch cycle moves the
        turns on."""
        if self._turn.timed:
            self._seconds[self._turn.speculate] += seconds
            self._batches[self._turn.speculate] += batches
        if not batch_cycle:
            return
        self._cycles += 1
        if self._cycles == TURN_CYCLES:
            self._cycles = 0
            self._turn = next(self._turns)

    def tally(self) -> str:
        return f"auto: speculated after {self.chose_on} of {self.trials} trial(s)"

    def _schedule(self) -> Iterator[_Turn]:
        yield _Turn(False, timed=False)
        while True:
            yield from (_Turn(speculate, timed=True) for speculate in TRIAL)
            yield from repeat(_Turn(self._decide(), timed=False), HOLD_TURNS)

    def _decide(self) -> bool:
        """The trial's choice, rank 0's on every rank; said when it changes."""
        rate = {way: self._batches[way] / max(self._seconds[way], 1e-9) for way in (True, False)}
        # A trial in which a way trained nothing (the round's end, the scheduler idling us)
        # compares nothing: the way kept stays (awaiting before any trial).
        if 0 in self._batches.values():
            speculate = bool(self._kept)
        else:
            speculate = rate[True] >= PAYS * rate[False]
        speculate = self._share(speculate)
        self.trials += 1
        self.chose_on += speculate
        if speculate != self._kept:
            way = "speculating" if speculate else "awaiting each answer"
            self._say(
                f"speculative step auto: {way} ({rate[True]:.2f} batches/s speculating, "
                f"{rate[False]:.2f} awaiting, measured in turns)"
            )
        self._kept = speculate
        self._seconds = {True: 0.0, False: 0.0}
        self._batches = {True: 0, False: 0}
        return speculate


@dataclass(frozen=True)
class Speculation:
    """The speculative step as HYPHA_SPECULATIVE_STEP asks and the accelerator allows: the
    step computed ahead (None when off), `auto`'s trials of it (None when speculating always,
    or never), and the line that says which."""

    ahead: SpeculativeStep | None
    auto: AutoSpeculation | None
    note: str


def speculation(
    choice: str,
    accelerator: Accelerator,
    step: MicroBatchedStep,
    model: torch.nn.Module,
    next_batch: Callable[[], Batch],
    share: Callable[[bool], bool],
    say: Callable[[str], None],
) -> Speculation:
    """`choice`: HYPHA_SPECULATIVE_STEP's auto, on or off."""
    if choice == "off":
        return Speculation(None, None, "speculative step off, as asked: each action is awaited")
    if (why := cannot_drop(accelerator)) is not None:
        return Speculation(None, None, f"speculative step off: {why}; each action is awaited")
    ahead = SpeculativeStep(step, model, accelerator.device, next_batch)
    if choice != "auto":
        return Speculation(ahead, None, "speculative step on")
    return Speculation(
        ahead,
        AutoSpeculation(share, say),
        "speculative step auto: tried in turns against awaiting each answer, kept where it pays",
    )
