"""The action protocol's aggregate exchange, the counterpart of alpha.17's Synchroniser: our
update out to the parameter servers, their aggregate in, each aggregate merged into
theta_global exactly once. One object on every rank owns the whole state of it; only rank 0's
has a bridge (`client`), and every decision the ranks must share goes through `ranks.share`.
Every rank writes its part of our update and merges its part of each aggregate (diloco.py):
rank 0 receives an aggregate, checks it and keeps it aside (`accept`) until every rank has
merged it (`merge_accepted`).

Never a lost update: upstream's worker refuses a push that no open receive takes (the
pusher's stream is refused; its parameter server's whole broadcast fails), and the
parameter server can push the aggregate before `apply-update` reaches us, even before our
own send returns when ours completes the round, or while we still train (a round closed at
a quorum without our update). So before its first send rank 0 opens a receive from the
send's target and keeps one open from then on (bridge/receiver.py, its files queued);
`apply-update` takes the oldest aggregate from it, and one it holds is applied before the
next action that trains or uses the model (`apply_held`).

The aggregate of a round is awaited from our send (`due`); one that did not come within
HELD_AGGREGATE_WAIT_S of the next action that needs the model is looked for again at each
later action (`late`) until it comes or the next send.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hypha.accelerate_executor import telemetry
from hypha.accelerate_executor.errors import BridgeAnswerError, ExecutorError
from hypha.accelerate_executor.protocol.actions.job import ActionPeersReference
from hypha.accelerate_executor.protocol.actions.messages import Status, error_status
from hypha.accelerate_executor.protocol.job import Strategy

if TYPE_CHECKING:
    import torch

    from hypha.accelerate_executor.bridge.client import ReceivedFile
    from hypha.accelerate_executor.bridge.receiver import KeptOpenReceiver
    from hypha.accelerate_executor.training.actions.bridge import ActionBridgeClient
    from hypha.accelerate_executor.training.diloco import GlobalWeights
    from hypha.accelerate_executor.training.distributed import Ranks

RECEIVE_DIR = "incoming"
# An action that trains after our send, with no `apply-update` between, means the round has
# moved on: the aggregate is on our bridge, or on its way to the standing receive. How long it
# may take to come out of the receive before the action goes on without it (a push the
# bridge dropped); a later one is still applied at the next action that uses the model.
HELD_AGGREGATE_WAIT_S = 10.0

# Where our last sent update's aggregate stands: none awaited, awaited since our send, or
# not come within the wait and looked for at each action.
Awaited = Literal["none", "due", "late"]


class AggregateExchange:
    def __init__(
        self,
        client: ActionBridgeClient | None,
        global_weights: GlobalWeights,
        ranks: Ranks,
        work_dir: Path,
        say: Callable[[str], None],
        next_round: Callable[[], int],
    ) -> None:
        """`next_round`: the number of the round the loop is in, which log lines name."""
        self.client = client  # rank 0's bridge; None on the other ranks
        self.global_weights = global_weights
        self.ranks = ranks
        self.work_dir = work_dir
        self.say = say
        self.next_round = next_round
        self.awaited: Awaited = "none"
        self.updates_sent = 0
        # Rank 0's receive from the parameter servers, kept open from our first send on, and
        # whom it receives from.
        self.standing: KeptOpenReceiver | None = None
        self.standing_source: ActionPeersReference | None = None
        # Rank 0: the aggregate received and checked, kept aside until every rank merged it.
        self.accepted: Path | None = None
        self.aggregates_accepted = 0
        # Every rank: its part of the last aggregate merged, kept while the local weights must
        # move by it too (batches trained since our last send; `merge_accepted`'s keep).
        self.last_update: dict[str, torch.Tensor] = {}

    def send(
        self,
        local: dict[str, torch.Tensor],
        target: ActionPeersReference,
        dtype: torch.dtype,
        weight: float,
    ) -> tuple[Status | None, int]:
        """weight x (theta_local - theta_global) to the target, on every rank (each writes its
        part, rank 0 sends it); the shared error status when it did not go, and the file's
        size."""
        problem = None
        relative = f"pseudo-gradients/update-{self.updates_sent}.safetensors"
        self.updates_sent += 1
        size = self.global_weights.write_pseudo_gradient(
            local, self.work_dir / relative, dtype, weight
        )
        if self.client is not None:
            problem = self._send_file(target, relative)
        problem = self.ranks.share(problem)
        if problem is None:
            self.awaited = "due"
        return problem, size

    def apply(self, source: ActionPeersReference, deadline: float) -> Status | None:
        """`apply-update`: the oldest aggregate from `source` accepted, for `merge_accepted`;
        the shared error status when none came or it is not one this model can merge."""
        problem = None
        if self.client is not None:
            problem = self.receive_into(source, deadline, self.accept, standing=True)
        return self.ranks.share(problem)

    def apply_held(self, arrived: bool) -> bool:
        """Before an action that trains or uses the model: whether an aggregate that came
        without an `apply-update` (upstream's order) is now merged, on every rank. Waits for
        it only while one is due since our send; one that came later than that wait is
        merged whenever it is found. `arrived`: one came that no send of ours made due, a
        round closed at a quorum without our update; merged too."""
        if self.awaited == "none" and not arrived:
            return False  # the common case, with no collective
        merged = False
        if self.client is not None:
            merged = self._accept_held()
            if merged and self.awaited == "none":
                self.say(
                    f"round {self.next_round()}'s aggregate came without our update (the "
                    "round closed at a quorum without us); applied, the batches since our "
                    "last send kept on top of it for our next one"
                )
        merged = self.ranks.share(merged)
        if not merged and self.awaited == "due":
            self.awaited = "late"  # waited once; looked for at each action from now on
        return merged

    def applied(self) -> None:
        """Every rank, once the round's aggregate is merged: none is awaited."""
        self.awaited = "none"

    def arrived(self) -> bool:
        """Rank 0: the standing receive holds an aggregate (False on the other ranks)."""
        return self.standing is not None and self.standing.holds_file()

    def accept(self, path: Path) -> int:
        """Rank 0: the update at `path` checked against the model and kept aside for
        `merge_accepted`; how many tensors it holds. An update that lacks tensors the model
        has (a peer that sent another dtype: upstream's parameter server adds only tensors of
        one name, shape and dtype, and leaves the others out) moves only part of the model,
        or none of it: said on stdout and as telemetry, every round it happens."""
        held = self.global_weights.check_update(path)
        self._keep_aside(path)
        expected = len(self.global_weights.shares)
        if held < expected:
            round_number = self.next_round()
            # On stdout, the log the later releases' runtime keeps (it keeps no stderr).
            self.say(
                f"warning: round {round_number}'s update held {held} of {expected} "
                "tensors; the others did not move (does every peer send the same dtype? "
                "HYPHA_PSEUDO_GRADIENT_DTYPE)"
            )
            telemetry.round_ended(
                {"round": float(round_number), "update_tensors_held": float(held),
                 "update_tensors_expected": float(expected)}
            )  # fmt: skip
        return held

    def merge_accepted(self, keep: bool) -> None:
        """Every rank, once rank 0 accepted an aggregate: its part merged into theta_global;
        with `keep`, its part of the update kept in `last_update` for the local weights."""
        path = Path(self.ranks.share(str(self.accepted) if self.accepted else ""))
        self.last_update = self.global_weights.merge_update(path, keep).update
        self.ranks.barrier()  # every rank has read the file
        if self.accepted is not None:
            self.accepted.unlink(missing_ok=True)
            self.accepted = None

    def accept_model(self, path: Path) -> int:
        """Rank 0: a peer's model file at `path`, checked to hold every tensor of the model
        and kept aside for `replace_accepted`; how many tensors it holds."""
        held = self.global_weights.check_model(path)
        self._keep_aside(path)
        return held

    def _keep_aside(self, path: Path) -> None:
        """Rank 0: the received file moved where the receive will not delete it, until every
        rank has read it."""
        self.accepted = path.with_name(f"accepted-{self.aggregates_accepted}.safetensors")
        self.aggregates_accepted += 1
        os.replace(path, self.accepted)

    def replace_accepted(self) -> Status | None:
        """Every rank, once rank 0 accepted a peer's model: its part of theta_global replaced
        by it; the error status when the file could not be read."""
        path = Path(self.ranks.share(str(self.accepted) if self.accepted else ""))
        problem = None
        try:
            self.global_weights.replace_from(path)
        except ExecutorError as exc:
            problem = error_status("other", str(exc))
        self.ranks.barrier()  # every rank has read the file
        if self.accepted is not None:
            self.accepted.unlink(missing_ok=True)
            self.accepted = None
        return problem

    def receive_into(
        self,
        source: ActionPeersReference,
        deadline: float,
        use: Callable[[Path], int],
        standing: bool = False,
    ) -> Status | None:
        """Rank 0: one file from `source` before `deadline`, handed to `use(path)`; with
        `standing`, the oldest from the standing receive when there is one for `source`. An
        error status when none came or it could not be used."""
        try:
            received = self._receive(source, deadline, standing)
        except BridgeAnswerError as exc:
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

    def _send_file(self, target: ActionPeersReference, relative: str) -> Status | None:
        """Rank 0: the update's file sent (the bridge tries transient failures again,
        bridge/retry.py); an error status when it did not go."""
        assert self.client is not None
        # Open before the send: ours may be the round's last update, and the parameter
        # server can push the aggregate as soon as it has it, before the send returns.
        self._open_standing_receive(target)
        try:
            self.client.send_file(target, relative, remove_file=True)
        except BridgeAnswerError as exc:
            # The bridge deletes the file only once sent: a failed send's is ours to remove,
            # a model's worth of disk each.
            (self.work_dir / relative).unlink(missing_ok=True)
            return error_status("connection", f"sending the update failed: {exc}")
        return None

    def _accept_held(self) -> bool:
        """Rank 0: whether the standing receive held an aggregate that is now accepted."""
        if self.standing is None:
            return False
        due = self.awaited == "due"
        wait_s = HELD_AGGREGATE_WAIT_S if due else 0.0
        try:
            received = self.standing.take(time.time() + wait_s)
        except BridgeAnswerError as exc:
            if due:  # said once, not at each later action that looks
                self.say(f"round {self.next_round()}'s aggregate was not received: {exc}")
            return False
        if received is None:
            if due:
                self.say(
                    f"round {self.next_round()}'s aggregate did not come within {wait_s:g} s "
                    "of the next action; training on, it is applied once it comes"
                )
            return False
        try:
            self.accept(received.path)
        except ExecutorError as exc:
            self.say(f"round {self.next_round()}'s aggregate could not be applied: {exc}")
            return False
        finally:
            received.path.unlink(missing_ok=True)
        return True

    def _open_standing_receive(self, target: ActionPeersReference) -> None:
        """Rank 0, before each send: a receive from every peer of the send's target (the
        parameter servers; the one that takes the update pushes the aggregate), opened at
        the first and kept open from then on, registered before the send goes. One at a
        time: upstream's worker registers a single receive, and a second beside it is
        refused."""
        from hypha.accelerate_executor.training.actions.bridge import standing_receive

        assert self.client is not None
        if self.standing is None:
            source = target.model_copy(update={"strategy": Strategy(type="All")})
            self.standing = standing_receive(self.client, source, RECEIVE_DIR)
            self.standing_source = source
        else:
            self.standing.wait_open()  # reopened after a file, or asked again after a 204

    def _receive(
        self, source: ActionPeersReference, deadline: float, standing: bool
    ) -> ReceivedFile | None:
        assert self.client is not None
        kept, kept_from = (self.standing, self.standing_source) if standing else (None, None)
        if kept is not None and kept_from is not None and set(kept_from.peers) <= set(source.peers):
            return kept.take(deadline)
        return self.client.receive_one(source, RECEIVE_DIR, deadline)
