"""The action protocol's training loop (docs/protocol-actions.md): report a status, do the
action the scheduler answers with, report what came of it, until `terminate`.

    joined -> idle | wait-for-model
    execute-batch{n}      train n batches (n > 0)               -> batch-completed{batch_size, n}
    execute-batch{0}      wait about a batch's time             -> idle
    send-update{t, w}     send w x (theta_local - theta_global) -> sent-update{round, metrics}
    apply-update{s, d}    theta_global += u, load it            -> applied-update
    idle{d}               wait until d                          -> idle
    wait-for-model{d}     wait the loop's minimum (100 ms)      -> waited-for-model
    receive-model{s, d}   theta_global = a peer's, load it      -> received-model
    send-model{t}         send a copy of theta_global           -> sent-model
    push-to-hub{r, t}     theta_global in HF layout, uploaded     -> pushed-to-hub
    terminate             theta_global kept (HYPHA_MODEL_DIR); exit 0

A bridge that refuses or a peer that sends nothing in time becomes `error{connection}`, any
other failure of an action `error{other}`; the scheduler decides what follows (idle, or
terminate). The bridge disappearing ends the executor: the worker has stopped the job.

Only rank 0 talks to the bridge. It shares each action with every rank, every rank takes
part in the action's collectives (the steps, gathering the weights, loading them), and
rank 0 shares whether its own part (a send, a receive) worked before the others load
anything.

Never a lost update: the aggregate exchange (exchange.py) keeps a receive open from our first
send on and applies each aggregate exactly once, in upstream's order. A `receive-model`'s
source is named only by the action itself, so that receive opens then.

Never a stale status: each action is answered with the status of what it did, so a sample
is reported once (upstream resends its previous status after `execute-batch{0}`).

Never an idle device while the scheduler decides (speculative.py): after a status that
usually leads to a batch, the next batch's gradient is computed while the status is on its
way, and stepped on when the answer is `execute-batch`, dropped when not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hypha.accelerate_executor.errors import BridgeAnswerError, ExecutorError
from hypha.accelerate_executor.protocol.actions.job import ActionJob, ActionPeersReference
from hypha.accelerate_executor.protocol.actions.messages import (
    APPLIED_UPDATE,
    IDLE,
    JOINED,
    PUSHED_TO_HUB,
    RECEIVED_MODEL,
    SENT_MODEL,
    WAITED_FOR_MODEL,
    Action,
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    PushToHub,
    ReceiveModel,
    SendModel,
    SendUpdate,
    Status,
    Terminate,
    WaitForModel,
    batch_completed,
    error_status,
    sent_update,
)
from hypha.accelerate_executor.training.clocks import Laps
from hypha.accelerate_executor.training.round_metrics import (
    loss_text,
    memory_text,
    round_ended,
    training_metrics,
)
from hypha.accelerate_executor.training.workbench import Workbench

if TYPE_CHECKING:
    import torch

    from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
    from hypha.accelerate_executor.training.actions.exchange import AggregateExchange
    from hypha.accelerate_executor.training.actions.speculative import (
        AutoSpeculation,
        SpeculativeStep,
    )
    from hypha.accelerate_executor.training.data import Batch
    from hypha.accelerate_executor.training.diloco import GlobalWeights
    from hypha.accelerate_executor.training.model_output import ModelOutput
    from hypha.accelerate_executor.training.settings import RunSettings

# The minimum loop time of upstream's executors (MIN_LOOP_TIME_MS): an action that trains
# nothing (idle, waiting) is not answered sooner than this after the previous status, so a
# scheduler that answers at once is not asked again in a tight loop. Batches that train are
# reported at once.
MIN_LOOP_S = 0.1
# After `execute-batch{0}`, one of our own batches' time instead, within these bounds. The
# scheduler's answer changes only once a peer reports a batch, about a batch of ours from
# now in a pool of like workers; waiting the whole 100 ms left a fast device idle while its
# peers took the round's batches in turns (2-3 workers at 20-70 ms a batch: rounds 1.3-1.5x
# longer on a simulated clock; docs/protocol-actions.md, "execute-batch{0}").
ZERO_BATCHES_WAIT_S = (0.02, MIN_LOOP_S)
# Statuses after which the scheduler usually answers `execute-batch`: the next batch's
# gradient is computed while they are on their way. Each is the status of an action every
# rank reports alike, so every rank decides the same.
BEFORE_A_BATCH = frozenset({"batch-completed", "applied-update", "received-model"})
# The loop's clock is lapped as each action ends, so a lap runs from asking for the action
# to having done it, the scheduler's round trip included (the worker waits for it, as
# alpha.17's statuses count). The laps of actions that train are the TRAINING part, what
# `sent-update`'s samples_per_second is over.
TRAINING, OTHER = "training", "other"


@dataclass
class _Window:
    """What was trained since the last sent update: the numbers `sent-update` reports."""

    batches: int = 0
    seconds: float = 0.0  # the loop clock's TRAINING part, filled in when the window closes
    loss_sum: torch.Tensor | None = None


def zero_batches_wait(batch_seconds: float) -> float:
    """How long after its status `execute-batch{0}` is answered: about one of our batches."""
    low, high = ZERO_BATCHES_WAIT_S
    return min(max(batch_seconds, low), high)


def status_after_batches(batch_size: int, batches: int) -> Status:
    """What `execute-batch{batches}` is answered with. `execute-batch{0}` is answered `idle`:
    a `batch-completed{0}` moves the worker's clock in upstream's statistics (statistics.rs,
    index id 66460343894, through rl_scheduler.rs, id 66469012466), so with one batch left
    each worker, asking in turn, is projected 0 again, for ever. `idle` leaves the clock,
    and the simulation, time-invariant then, gives the worker with the earliest projected
    batch at least one. Nothing was trained, so nothing is counted."""
    return batch_completed(batch_size, batches) if batches else IDLE


class ActionTrainer(Workbench):
    job: ActionJob
    client: ActionBridgeClient | None  # rank 0's bridge, as the action client it is
    global_weights: GlobalWeights
    exchange: AggregateExchange  # our updates out, the aggregates in
    output: ModelOutput  # the model written, kept, pushed, sent
    laps: Laps  # the loop's clock, started by run()

    def __init__(self, job: ActionJob, run: RunSettings) -> None:
        import torch

        from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
        from hypha.accelerate_executor.training.actions.exchange import AggregateExchange
        from hypha.accelerate_executor.training.actions.speculative import speculation
        from hypha.accelerate_executor.training.diloco import GlobalWeights
        from hypha.accelerate_executor.training.model_output import ModelOutput

        self.client = None

        def make_bridge() -> ActionBridgeClient:
            self.client = ActionBridgeClient(run.socket_path, run.work_dir, job.job_id)
            return self.client

        super().__init__(job, make_bridge, run)
        self.work_dir = run.work_dir
        self.dtype = getattr(torch, run.pseudo_gradient_dtype)
        self.global_weights = GlobalWeights(self.weights.local(), self.weights.shares, self.ranks)
        self.round = 0  # updates applied (a received model counts as the round it joined)
        self.window = _Window()
        self.exchange = AggregateExchange(
            self.client, self.global_weights, self.ranks, self.work_dir, self.say,
            next_round=lambda: self.round + 1,
        )  # fmt: skip
        self.output = ModelOutput(
            self.accelerator, self.model, self.weights, self.global_weights, self.ranks,
            self.work_dir, run.model_dir, self.say,
        )  # fmt: skip
        self.said_lr_multiplier = False
        self.batch_seconds = MIN_LOOP_S  # a recent batch's time, from asking to trained
        chosen = speculation(
            run.speculative_step, self.accelerator, self.step, self.model,
            super().next_batch, self.ranks.share, self.say,
        )  # fmt: skip
        self.ahead: SpeculativeStep | None = chosen.ahead
        self.auto: AutoSpeculation | None = chosen.auto  # None: speculating always, or never
        self.speculation_note = chosen.note

    # The loop.

    def run(self) -> None:
        self.announce("action protocol")
        self.say(self.speculation_note)
        self.laps = Laps(TRAINING, OTHER)
        status: Status | None = JOINED
        finished = False
        try:
            while status is not None:
                batch_cycle = status.state in BEFORE_A_BATCH
                started = time.perf_counter()
                # With the answer, whether an aggregate came that no send of ours made due
                # (a round closed without us): every rank learns both in one collective.
                action, arrived = self.ranks.share(
                    (self._ask_and_compute(status), self.exchange.arrived())
                )
                trains = isinstance(action, ExecuteBatch) and action.batches > 0
                if self.ahead is not None:
                    self.ahead.settle(trains)
                settled = time.perf_counter()
                status = self.perform(action, arrived)
                self.laps.lap(TRAINING if trains else OTHER)
                if self.auto is not None:
                    self._time_cycle(self.auto, action, batch_cycle, started, settled)
            tally = "" if self.ahead is None else f"; {self.ahead.tally()}"
            if self.auto is not None:
                tally += f"; {self.auto.tally()}"
            self.say(f"terminated by the scheduler after {self.round} round(s){tally}")
            finished = True
        finally:
            # As in alpha.17's Trainer.run: the process leaves without the interpreter's join
            # of our threads, so a finished job lets the slice fetch in flight end first.
            self.data.close(wait=finished)
            if self.ahead is not None:
                self.ahead.close()
        self.ranks.finish()

    def _ask_and_compute(self, status: Status) -> Action | None:
        """Rank 0's answer to `status` (None on the others), the next batch's gradient
        computed meanwhile on every rank where that is worth it."""
        speculating = self.auto.speculate if self.auto is not None else True
        if self.ahead is not None and speculating and status.state in BEFORE_A_BATCH:
            return self.ahead.while_computing(lambda: self._ask(status))
        return self._ask(status)

    def _time_cycle(
        self,
        auto: AutoSpeculation,
        action: Action | None,
        batch_cycle: bool,
        started: float,
        settled: float,
    ) -> None:
        """Tells `auto` what a cycle took of what speculating changes (speculative.py,
        AutoSpeculation): every wait for an answer, and doing it unless it is a transfer or
        the idle wait for the aggregate of an update we sent, the same either way."""
        import torch

        trained = action.batches if isinstance(action, ExecuteBatch) else 0
        if batch_cycle and auto.closes_turn and self.accelerator.device.type == "cuda":
            torch.cuda.synchronize(self.accelerator.device)
        done = isinstance(action, ExecuteBatch) or (
            isinstance(action, Idle) and self.exchange.awaited != "due"
        )
        seconds = settled - started
        if done:
            seconds += time.perf_counter() - settled
        auto.cycle_ended(seconds, trained, batch_cycle)

    def _ask(self, status: Status) -> Action | None:
        if self.client is None:
            return None
        action = self.client.update(status)  # its deadline on our clock (scheduler_clock.py)
        if (note := self.client.scheduler_clock.take_note()) is not None:
            self.say(note)  # a large clock skew, told once
        return action

    def perform(self, action: Action | None, arrived: bool = False) -> Status | None:
        """Does `action` on every rank; rank 0's status of it, or None at `terminate`.
        `arrived`: rank 0's standing receive holds an aggregate (apply_held_aggregate)."""
        if isinstance(action, SendUpdate | SendModel) or (
            isinstance(action, ExecuteBatch) and action.batches > 0
        ):
            self.apply_held_aggregate(arrived)
        match action:
            case ExecuteBatch(batches=batches, lr_multiplier=multiplier):
                return self.execute_batches(batches, multiplier)
            case SendUpdate(target=target, weight=weight):
                return self.send_update(target, weight)
            case ApplyUpdate(source=source, deadline=deadline):
                return self.apply_update(source, deadline)
            case Idle(deadline=deadline):
                self.wait_until(deadline)
                return IDLE
            case WaitForModel():
                # Asked again after the loop's minimum, not at the deadline: the peer that
                # sends our model is named only in the answer to `waited-for-model`, and
                # until our receive opens its push is refused (upstream's bridge tries a
                # send again for about half a second).
                self.wait_until(0.0)
                return WAITED_FOR_MODEL
            case ReceiveModel(source=source, deadline=deadline):
                return self.receive_model(source, deadline)
            case SendModel(target=target):
                return self.send_model(target)
            case PushToHub(repository=repository, token=token):
                return self.push_to_hub(repository, token)
            case Terminate(reason=reason):
                if reason:
                    self.say(reason)
                self.output.keep(self.job.job_id)
                return None
        raise AssertionError(f"no action on rank {self.ranks.index}")  # share() gave None

    # Actions.

    def execute_batches(self, batches: int, lr_multiplier: float | None) -> Status:
        import torch

        if lr_multiplier is not None and not self.said_lr_multiplier:
            self.said_lr_multiplier = True
            self.say(
                f"note: execute-batch carries lr_multiplier {lr_multiplier:g}, an older form; "
                "its batch is trained at the job's own learning rate"
            )
        if batches == 0:
            self.wait_until(0.0, zero_batches_wait(self.batch_seconds))
            return status_after_batches(self.job.config.batch_size, 0)
        for _ in range(batches):
            loss = self.ahead.stepped() if self.ahead is not None else None
            if loss is None:
                loss = self.step(self.next_batch())
            self.lr_schedule.step()
            if self.window.loss_sum is None:
                self.window.loss_sum = torch.zeros((), device=self.accelerator.device)
            self.window.loss_sum += loss
            self.window.batches += 1
        self.batch_seconds = self.laps.since_lap / batches
        return status_after_batches(self.job.config.batch_size, batches)

    def send_update(self, target: ActionPeersReference, weight: float) -> Status:
        """weight x (theta_local - theta_global) to the target; the model trains on as it is
        (an update may never be applied to it: a late joiner's first send)."""
        local = self.weights.local()  # a collective where the weights are gathered
        loss = self._window_loss()  # a collective
        memory = self.peak_memory()  # and so is this
        problem, size = self.exchange.send(local, target, self.dtype, weight)
        del local
        # The window closes only once the update carrying it has gone: after a failed send
        # its batches and loss stay in it, for the `sent-update` of the send that succeeds
        # (a trained batch counted in exactly one, and every round's loss reported).
        if problem is not None:
            return problem
        window = self._close_window()
        # theta_global's digest: the same on every worker in a round (the stand-in checks).
        digest = self.global_weights.digest()  # a collective where the model is sharded
        if self.client is None:
            return IDLE  # only rank 0's status is sent
        metrics = {
            **training_metrics(
                batches=window.batches,
                samples=window.batches * self.job.config.batch_size,
                seconds=window.seconds,
                learning_rate=float(self.lr_schedule.get_last_lr()[0]),
                loss=loss,
                memory=memory,
            ),
            "weight": weight,
            "global_digest": float(digest),
        }
        round_ended(
            self.say,
            self.round + 1,
            {**metrics, "sent_bytes": float(size)},
            f"loss {loss_text(loss)} | {window.batches} batches | "
            f"weight {weight:.3f} | {size / 1e6:.1f} MB sent | {memory_text(memory)}",
        )
        return sent_update(self.round, metrics)

    def apply_update(self, source: ActionPeersReference, deadline: float) -> Status:
        """theta_global += u, loaded into the model. Also after no send of ours (a
        straggler): its drift since then is kept on top (_applied)."""
        problem = self.exchange.apply(source, deadline)
        if problem is not None:
            return problem
        self._applied()
        return APPLIED_UPDATE

    def apply_held_aggregate(self, arrived: bool = False) -> None:
        """Before an action that trains or uses the model: an aggregate that came without an
        `apply-update` (exchange.apply_held), applied as `apply-update` does; the batches
        trained since our last send kept on top (_applied)."""
        if self.exchange.apply_held(arrived):
            self._applied()

    def _applied(self) -> None:
        """Every rank, once rank 0 accepted a round's aggregate: merged into theta_global,
        each rank its part, and loaded. Batches
        trained since our last send are in no aggregate yet: a straggler's, whose round
        was aggregated at a quorum without it (upstream's grace time), or training that
        went on while the aggregate was late. The model keeps them on top of the update
        (theta_local += u, so theta_local - theta_global is still their drift) and the
        window stays open: they are counted, once, in the next sent update."""
        self.exchange.merge_accepted(keep=self.window.batches > 0)
        if self.window.batches:
            from hypha.accelerate_executor.training.diloco import moved_by

            local = self.weights.local()  # a collective where the weights are gathered
            update, self.exchange.last_update = self.exchange.last_update, {}
            self.weights.load(moved_by(local, update))
        else:
            self._load_global()
            self._close_window()  # an empty one: its clock starts again from here
        self.round += 1
        self.exchange.applied()

    def receive_model(self, source: ActionPeersReference, deadline: float) -> Status:
        """A late joiner's start: a peer's theta_global as the whole state."""
        problem = None
        if self.client is not None:
            problem = self.exchange.receive_into(source, deadline, self.exchange.accept_model)
        problem = self.ranks.share(problem) or self.exchange.replace_accepted()
        if problem is not None:
            return problem
        self._load_global()
        self._close_window()
        self.say("received the model from a peer")
        return RECEIVED_MODEL

    def send_model(self, target: ActionPeersReference) -> Status:
        """A copy of theta_global for a late joiner: every rank writes its part, rank 0 sends."""
        client = self.client
        try:
            self.output.send(
                None if client is None
                else lambda relative: client.send_file(target, relative, remove_file=True)
            )  # fmt: skip
        except BridgeAnswerError as exc:
            return error_status("connection", f"sending the model failed: {exc}")
        return SENT_MODEL if client is not None else IDLE

    def push_to_hub(self, repository: str, token: str) -> Status:
        """The final model, written in Hugging Face layout into the work dir (and the model
        dir when there is one) by rank 0, uploaded to `repository` (model_output.py)."""
        try:
            url = self.output.push(repository, token)
        except ExecutorError as exc:
            self.say(str(exc))
            return error_status("other", str(exc))
        if self.client is None:
            return IDLE  # only rank 0's status is sent
        self.say(f"pushed the model to {repository} ({url})")
        return PUSHED_TO_HUB

    # Parts.

    def next_batch(self) -> Batch:
        return self.ahead.next_batch() if self.ahead is not None else super().next_batch()

    def wait_until(self, deadline: float, loop_s: float = MIN_LOOP_S) -> None:
        """Until the scheduler's deadline, and at least `loop_s` after the last action ended
        (its status was sent then)."""
        pause = max(deadline - time.time(), loop_s - self.laps.since_lap)
        if pause > 0:
            time.sleep(pause)

    def _close_window(self) -> _Window:
        """The window so far, its seconds read off the loop's clock; a new one from now."""
        window, self.window = self.window, _Window()
        window.seconds = self.laps.take(TRAINING)
        return window

    def _load_global(self) -> None:
        self.weights.load(self.global_weights.tensors)

    def _window_loss(self) -> float | None:
        """The mean loss since the last sent update, over every rank's share; None when no
        batch was trained."""
        total = self.window.loss_sum
        batches = self.window.batches
        if total is None or not batches:
            return None
        if self.ranks.count > 1:  # a tensor-parallel group's ranks hold the same share
            total = self.accelerator.reduce(total, reduction="sum") / self.ranks.per_data_rank
        return float(total.item()) / batches
