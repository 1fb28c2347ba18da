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

Never a lost update: upstream's worker refuses a push that no open receive takes (the
pusher's stream is refused; its parameter server's whole broadcast fails), and the
parameter server can push the aggregate before `apply-update` reaches us, even before our
own send returns when ours completes the round, or while we still train (a round closed at
a quorum without our update). So before its first send rank 0 opens a receive from the
send's target and keeps one open from then on (a StandingReceive, its files queued);
`apply-update` takes the oldest aggregate from it, and one it holds is applied before the
next action that trains or uses the model. A `receive-model`'s source is named only by the
action itself, so that receive opens then.

Never a stale status: each action is answered with the status of what it did, so a sample
is reported once (upstream resends its previous status after `execute-batch{0}`).

Never an idle device while the scheduler decides (speculative.py): after a status that
usually leads to a batch, the next batch's gradient is computed while the status is on its
way, and stepped on when the answer is `execute-batch`, dropped when not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hypha.accelerate_executor import telemetry
from hypha.accelerate_executor.bridge.actions import (
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
from hypha.accelerate_executor.errors import BridgeError, ExecutorError
from hypha.accelerate_executor.spec.job import ActionJob, ActionPeersReference, Strategy
from hypha.accelerate_executor.training.clocks import Laps
from hypha.accelerate_executor.training.workbench import Workbench

if TYPE_CHECKING:
    import torch

    from hypha.accelerate_executor.bridge.action_client import (
        ActionBridgeClient,
        StandingReceive,
    )
    from hypha.accelerate_executor.bridge.client import ReceivedFile
    from hypha.accelerate_executor.training.data import Batch
    from hypha.accelerate_executor.training.diloco import GlobalWeights
    from hypha.accelerate_executor.training.speculative import AutoSpeculation, SpeculativeStep

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
RECEIVE_DIR = "incoming"
EXPORT_DIR = "model"  # the work dir's Hugging Face folder that push-to-hub uploads
# An action that trains after our send, with no `apply-update` between, means the round has
# moved on: the aggregate is on our bridge, or on its way to the standing receive. How long it
# may take to come out of the receive before the action goes on without it (a push the
# bridge dropped); a later one is still applied at the next action that uses the model.
HELD_AGGREGATE_WAIT_S = 10.0
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
    laps: Laps  # the loop's clock, started by run()

    def __init__(
        self,
        job: ActionJob,
        socket_path: Path,
        work_dir: Path,
        pseudo_gradient_dtype: str,
        micro_batch_size: int | None = None,
        trust_remote_code: bool = False,
        speculative_step: str = "auto",
        model_dir: Path | None = None,
        compile: str = "off",
    ) -> None:
        import torch

        from hypha.accelerate_executor.bridge.action_client import ActionBridgeClient
        from hypha.accelerate_executor.training.diloco import GlobalWeights
        from hypha.accelerate_executor.training.speculative import (
            AutoSpeculation,
            SpeculativeStep,
            cannot_drop,
        )

        self.client = None

        def make_bridge() -> ActionBridgeClient:
            self.client = ActionBridgeClient(socket_path, work_dir, job.job_id)
            return self.client

        super().__init__(job, make_bridge, work_dir, micro_batch_size, trust_remote_code, compile)
        self.work_dir = work_dir
        self.model_dir = model_dir  # where the final model is kept at terminate, if anywhere
        self.dtype = getattr(torch, pseudo_gradient_dtype)
        self.global_weights = GlobalWeights(self.weights.gather())  # a collective
        self.round = 0  # updates applied (a received model counts as the round it joined)
        self.updates_sent = 0
        self.models_sent = 0
        self.window = _Window()
        # Rank 0's receive from the parameter servers, kept open from our first send on.
        self.standing: StandingReceive | None = None
        # On every rank: an update was sent and its round's aggregate is not applied yet;
        # late: it did not come within the wait, so each action looks for it once more.
        self.aggregate_due = False
        self.aggregate_late = False
        # Rank 0: the update merged while batches since our last send were held (_applied).
        self.straggler_update: dict[str, torch.Tensor] = {}
        self.said_lr_multiplier = False
        self.batch_seconds = MIN_LOOP_S  # a recent batch's time, from asking to trained
        self.ahead: SpeculativeStep | None = None
        self.auto: AutoSpeculation | None = None  # None: speculating always, or never
        self.speculation_note = "speculative step off, as asked: each action is awaited"
        if speculative_step != "off" and (why := cannot_drop(self.accelerator)) is not None:
            self.speculation_note = f"speculative step off: {why}; each action is awaited"
        elif speculative_step != "off":
            self.ahead = SpeculativeStep(
                self.step, self.model, self.accelerator.device, super().next_batch
            )
            self.speculation_note = "speculative step on"
            if speculative_step == "auto":
                self.auto = AutoSpeculation(self.ranks.share, self.say)
                self.speculation_note = (
                    "speculative step auto: tried in turns against awaiting each answer, "
                    "kept where it pays"
                )

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
                    (self._ask_and_compute(status), self._aggregate_arrived())
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
            # As in training.Trainer.run: the process leaves without the interpreter's join
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
            isinstance(action, Idle) and not self.aggregate_due
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
                self.keep_model()
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
        local = self.weights.gather()  # a collective
        loss = self._window_loss()  # a collective too
        problem, size, relative = None, 0, ""
        if self.client is not None:
            relative = f"pseudo-gradients/update-{self.updates_sent}.safetensors"
            self.updates_sent += 1
            size = self.global_weights.write_pseudo_gradient(
                local, self.work_dir / relative, self.dtype, weight
            )
        del local
        if self.client is not None:
            problem = self._send_update_file(target, relative)
        # The window closes only once the update carrying it has gone: after a failed send
        # its batches and loss stay in it, for the `sent-update` of the send that succeeds
        # (a trained batch counted in exactly one, and every round's loss reported).
        problem = self.ranks.share(problem)
        if problem is not None:
            return problem
        window = self._close_window()
        self.aggregate_due, self.aggregate_late = True, False
        if self.client is None:
            return IDLE  # only rank 0's status is sent
        # theta_global's digest: the same on every worker in a round (the stand-in checks).
        metrics = {
            "batches": float(window.batches),
            "weight": weight,
            "global_digest": float(self.global_weights.digest()),
        }
        if window.batches:
            samples = window.batches * self.job.config.batch_size
            metrics["samples_per_second"] = samples / max(window.seconds, 1e-9)
            metrics["learning_rate"] = float(self.lr_schedule.get_last_lr()[0])
        if loss is not None:
            metrics["loss"] = loss
        if (peak := self.peak_device_memory()) is not None:
            metrics["peak_device_memory_bytes"] = float(peak)
        figures = {"round": self.round + 1.0, **metrics, "sent_bytes": float(size)}
        telemetry.round_ended(figures)
        self.say(
            f"round {self.round + 1}: loss "
            f"{'-' if loss is None else f'{loss:.4f}'} | {window.batches} batches | "
            f"weight {weight:.3f} | {size / 1e6:.1f} MB sent",
            figures,
        )
        return sent_update(self.round, metrics)

    def _send_update_file(self, target: ActionPeersReference, relative: str) -> Status | None:
        """Rank 0: the update's file sent (the bridge tries transient failures again,
        bridge/retry.py); an error status when it did not go."""
        assert self.client is not None
        # Open before the send: ours may be the round's last update, and the parameter
        # server can push the aggregate as soon as it has it, before the send returns.
        self._open_standing_receive(target)
        try:
            self.client.send_file(target, relative, remove_file=True)
        except BridgeError as exc:
            # The bridge deletes the file only once sent: a failed send's is ours to remove,
            # a model's worth of disk each.
            (self.work_dir / relative).unlink(missing_ok=True)
            return error_status("connection", f"sending the update failed: {exc}")
        return None

    def apply_update(self, source: ActionPeersReference, deadline: float) -> Status:
        """theta_global += u, loaded into the model. Also after no send of ours (a
        straggler): its drift since then is kept on top (_applied)."""
        problem = None
        if self.client is not None:
            problem = self._receive_into(source, deadline, self._merge, standing=True)
        problem = self.ranks.share(problem)
        if problem is not None:
            return problem
        self._applied()
        return APPLIED_UPDATE

    def apply_held_aggregate(self, arrived: bool = False) -> None:
        """Before an action that trains or uses the model: the aggregate that came without
        an `apply-update` (upstream's order), merged and loaded as `apply-update` does.
        Waits for it only while one is due since our send; one that came later than that
        wait is applied whenever it is found. `arrived`: one came that no send of ours made
        due, a round closed at a quorum without our update; applied too, the batches
        trained since our last send kept on top (_applied)."""
        if not (self.aggregate_due or self.aggregate_late or arrived):
            return  # the common case, with no collective
        applied = False
        if self.client is not None:
            applied = self._merge_held()
            if applied and not (self.aggregate_due or self.aggregate_late):
                self.say(
                    f"round {self.round + 1}'s aggregate came without our update (the round "
                    "closed at a quorum without us); applied, the batches since our last "
                    "send kept on top of it for our next one"
                )
        applied = self.ranks.share(applied)
        if applied:
            self._applied()
        elif self.aggregate_due:
            # Waited once; looked for again at each action until the next send or apply.
            self.aggregate_due, self.aggregate_late = False, True

    def _merge_held(self) -> bool:
        """Rank 0: whether the standing receive held an aggregate that is now merged."""
        if self.standing is None:
            return False
        wait_s = HELD_AGGREGATE_WAIT_S if self.aggregate_due else 0.0
        try:
            received = self.standing.take(time.time() + wait_s)
        except BridgeError as exc:
            if self.aggregate_due:  # said once, not at each later action that looks
                self.say(f"round {self.round + 1}'s aggregate was not received: {exc}")
            return False
        if received is None:
            if self.aggregate_due:
                self.say(
                    f"round {self.round + 1}'s aggregate did not come within {wait_s:g} s of "
                    "the next action; training on, it is applied once it comes"
                )
            return False
        try:
            self._merge(received.path)
        except ExecutorError as exc:
            self.say(f"round {self.round + 1}'s aggregate could not be applied: {exc}")
            return False
        finally:
            received.path.unlink(missing_ok=True)
        return True

    def _aggregate_arrived(self) -> bool:
        """Rank 0: the standing receive holds an aggregate (False on the other ranks)."""
        return self.standing is not None and self.standing.holds_file()

    def _merge(self, path: Path) -> int:
        """Rank 0: theta_global += the update at `path`. An update that lacks tensors the
        model has (a peer that sent another dtype: upstream's parameter server adds only
        tensors of one name, shape and dtype, and leaves the others out) moves only part of
        the model, or none of it: said on stderr and as telemetry, every round it happens."""
        held = self.global_weights.merge_update(path)
        if self.window.batches:  # every rank's window counts alike; see _applied
            from safetensors.torch import load_file

            self.straggler_update = load_file(path)
        expected = len(self.global_weights.tensors)
        if held < expected:
            round_number = self.round + 1
            # On stdout, the log the later releases' runtime keeps (it keeps no stderr).
            self.say(
                f"warning: round {round_number}'s update held {held} of {expected} tensors; "
                "the others did not move (does every peer send the same dtype? "
                "HYPHA_PSEUDO_GRADIENT_DTYPE)"
            )
            telemetry.round_ended(
                {"round": float(round_number), "update_tensors_held": float(held),
                 "update_tensors_expected": float(expected)}
            )  # fmt: skip
        return held

    def _applied(self) -> None:
        """Every rank, once rank 0 merged a round's aggregate into theta_global. Batches
        trained since our last send are in no aggregate yet: a straggler's, whose round
        was aggregated at a quorum without it (upstream's grace time), or training that
        went on while the aggregate was late. The model keeps them on top of the update
        (theta_local += u, so theta_local - theta_global is still their drift) and the
        window stays open: they are counted, once, in the next sent update."""
        if self.window.batches:
            self._rebase_local()
        else:
            self._load_global()
            self._close_window()  # an empty one: its clock starts again from here
        self.round += 1
        self.aggregate_due = self.aggregate_late = False

    def _rebase_local(self) -> None:
        """Every rank: theta_local += u, u the update rank 0 just merged."""
        import torch

        local = self.weights.gather()  # a collective
        update, self.straggler_update = self.straggler_update, {}
        moved = {}
        for name, tensor in local.items():
            delta = update.get(name)
            here = tensor.detach().to("cpu")
            if delta is None:
                moved[name] = here.clone()
            elif here.dtype == torch.bool:
                moved[name] = here ^ delta.to(torch.bool)
            elif here.is_floating_point():
                moved[name] = (here.float() + delta.float()).to(here.dtype)
            else:  # as merge_update treats an integer tensor
                moved[name] = here + delta.to(here.dtype)
        del local
        self.weights.load(moved)

    def receive_model(self, source: ActionPeersReference, deadline: float) -> Status:
        """A late joiner's start: a peer's theta_global as the whole state."""
        problem = None
        if self.client is not None:
            problem = self._receive_into(source, deadline, self.global_weights.replace_from)
        problem = self.ranks.share(problem)
        if problem is not None:
            return problem
        self._load_global()
        self._close_window()
        self.say("received the model from a peer")
        return RECEIVED_MODEL

    def send_model(self, target: ActionPeersReference) -> Status:
        """A copy of theta_global for a late joiner: a file of its own, which the bridge
        deletes once sent."""
        if self.client is None:
            return IDLE
        relative = f"models/model-{self.models_sent}.safetensors"
        self.models_sent += 1
        self.global_weights.write_model(self.work_dir / relative)
        try:
            self.client.send_file(target, relative, remove_file=True)
        except BridgeError as exc:
            return error_status("connection", f"sending the model failed: {exc}")
        return SENT_MODEL

    def push_to_hub(self, repository: str, token: str) -> Status:
        """The final model, written in Hugging Face layout into the work dir (and the model
        dir when there is one) by rank 0, uploaded to `repository` (hub_push.py)."""
        from hypha.accelerate_executor.training.hub_push import push

        folder = self.work_dir / EXPORT_DIR
        if self.client is None:
            self.write_model(folder)
            return IDLE  # only rank 0's status is sent
        try:
            self.write_model(folder)
            url = push(folder, repository, token)
        except ExecutorError as exc:
            self.say(str(exc))
            return error_status("other", str(exc))
        self.say(f"pushed the model to {repository} ({url})")
        return PUSHED_TO_HUB

    def keep_model(self) -> None:
        """At `terminate`: the final model into the operator's model dir, if one is set, in a
        folder named after the job (one job's model never overwrites another's), so that
        nothing trained is lost when the job has no destination."""
        if self.model_dir is not None:
            self.write_model(self.model_dir / self.job.job_id)

    def write_model(self, folder: Path) -> None:
        """Rank 0 writes theta_global as a Hugging Face folder (model_export.py)."""
        from hypha.accelerate_executor.training.model_export import write_hf_folder

        try:
            if self.ranks.is_main:
                files = write_hf_folder(
                    self.accelerator.unwrap_model(self.model),
                    self.global_weights.tensors,
                    self.weights.aliases,
                    self.work_dir / "artifacts",
                    folder,
                )
                self.say(f"wrote the model to {folder}: {', '.join(files)}")
        finally:
            self.ranks.barrier()  # the other ranks wait for rank 0 whatever came of it

    # Parts.

    def next_batch(self) -> Batch:
        return self.ahead.next_batch() if self.ahead is not None else super().next_batch()

    def wait_until(self, deadline: float, loop_s: float = MIN_LOOP_S) -> None:
        """Until the scheduler's deadline, and at least `loop_s` after the last action ended
        (its status was sent then)."""
        pause = max(deadline - time.time(), loop_s - self.laps.since_lap)
        if pause > 0:
            time.sleep(pause)

    def _open_standing_receive(self, target: ActionPeersReference) -> None:
        """Rank 0, before each send: a receive from every peer of the send's target (the
        parameter servers; the one that takes the update pushes the aggregate), opened at
        the first and kept open from then on, registered before the send goes. One at a
        time: upstream's worker registers a single receive, and a second beside it is
        refused."""
        from hypha.accelerate_executor.bridge.action_client import StandingReceive

        assert self.client is not None
        if self.standing is None:
            source = target.model_copy(update={"strategy": Strategy(type="All")})
            self.standing = StandingReceive(self.client, source, RECEIVE_DIR)
        else:
            self.standing.wait_open()  # reopened after a file, or asked again after a 204

    def _receive(
        self, source: ActionPeersReference, deadline: float, standing: bool
    ) -> ReceivedFile | None:
        """Rank 0: one file from `source` before `deadline`, None when none came; with
        `standing`, the oldest from the standing receive when there is one for `source`."""
        assert self.client is not None
        kept = self.standing if standing else None
        if kept is not None and set(kept.reference.peers) <= set(source.peers):
            return kept.take(deadline)
        return self.client.receive_one(source, RECEIVE_DIR, deadline)

    def _receive_into(
        self,
        source: ActionPeersReference,
        deadline: float,
        use: Callable[[Path], int],
        standing: bool = False,
    ) -> Status | None:
        """Rank 0: one file from `source` before `deadline` (see `_receive`), handed to
        `use(path)`; an error status when none came or it could not be used."""
        try:
            received = self._receive(source, deadline, standing)
        except BridgeError as exc:
            return error_status("connection", f"receiving failed: {exc}")
        if received is None:
            return error_status("connection", "nothing arrived before the deadline")
        try:
            use(received.path)
        except ExecutorError as exc:
            return error_status("other", str(exc))
        finally:
            received.path.unlink(missing_ok=True)
        return None

    def _close_window(self) -> _Window:
        """The window so far, its seconds read off the loop's clock; a new one from now."""
        window, self.window = self.window, _Window()
        window.seconds = self.laps.take(TRAINING)
        return window

    def _load_global(self) -> None:
        self.weights.load(self.global_weights.tensors if self.ranks.is_main else {})

    def _window_loss(self) -> float | None:
        """The mean loss since the last sent update, over every rank's share; None when no
        batch was trained."""
        total = self.window.loss_sum
        batches = self.window.batches
        if total is None or not batches:
            return None
        if self.ranks.count > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        return float(total.item()) / batches
