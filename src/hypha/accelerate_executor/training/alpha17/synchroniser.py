"""One DiLoCo sync round over the Job Bridge, timed part by part.

Every rank writes its part of theta_local - theta_global (all of it on rank 0 where the
weights are gathered, its own runs where the model is sharded: diloco.py); rank 0 sends the
file to the parameter server and reports `update`, and waits for the update u; every rank adds
its part of u to its theta_global and loads that into the model; rank 0 reports
`update-received`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hypha.accelerate_executor.protocol.alpha17.job import PeersReference
from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    Done,
    Ok,
    SchedulerAnswer,
    expect,
)
from hypha.accelerate_executor.training.alpha17.bridge import Alpha17Bridge, update_inbox
from hypha.accelerate_executor.training.clocks import Laps
from hypha.accelerate_executor.training.diloco import GlobalWeights
from hypha.accelerate_executor.training.distributed import ModelWeights, Ranks

# In order. write: gather (where the model is not sharded) and write the pseudo-gradient;
# send: hand it to the bridge and report `update`; wait: for the parameter server; merge:
# theta_global += u; load: into the model; report: `update-received`.
PARTS = ("write", "send", "wait", "merge", "load", "report")


@dataclass
class SyncRound:
    answer: SchedulerAnswer | None  # Continue or Done; None on ranks other than 0
    bytes_out: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # by part, on rank 0

    @property
    def overhead_s(self) -> float:
        """What the round cost this worker: everything but waiting for the other workers."""
        return sum(seconds for part, seconds in self.seconds.items() if part != "wait")


class Synchroniser:
    def __init__(
        self,
        weights: ModelWeights,
        ranks: Ranks,
        work_dir: Path,
        bridge: Alpha17Bridge | None,
        updates: PeersReference,
        results: PeersReference,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """Takes the starting weights (a collective where they are gathered) and, on rank 0
        (the one with a bridge), opens the job's one receive stream."""
        self.weights = weights
        self.ranks = ranks
        self.work_dir = work_dir
        self.global_weights = GlobalWeights(weights.local(), weights.shares, ranks)
        self.bridge = bridge
        self.updates = updates
        self.dtype = dtype
        self.inbox = update_inbox(bridge, results) if bridge is not None else None

    def run(self, round_number: int) -> SyncRound:
        """A collective: every rank writes, merges and loads its part; rank 0 talks."""
        laps = Laps()
        local = self.weights.local()
        relative = f"pseudo-gradients/round-{round_number}.safetensors"
        size = self.global_weights.write_pseudo_gradient(
            local, self.work_dir / relative, self.dtype
        )
        del local
        laps.lap("write")
        update = ""  # where the parameter server's update lies, known to rank 0 first
        if self.bridge is not None and self.inbox is not None:
            self.bridge.send(self.updates, relative)  # never touched again
            expect(self.bridge.status("update"), Ok, sent="update")
            laps.lap("send")
            received = self.inbox.take()
            assert received is not None  # with no deadline, a file or the failure raised
            update = str(received.path)
            laps.lap("wait")
        update = self.ranks.share(update)
        self.global_weights.merge_update(Path(update))
        laps.lap("merge")
        self.weights.load(self.global_weights.tensors)
        # The update's file is read by every rank before the parameter server may send the
        # next one in its place.
        self.ranks.barrier()
        laps.lap("load")
        if self.bridge is None:
            return SyncRound(answer=None)
        answer = self.bridge.status("update-received")
        expect(answer, Continue, Done, sent="update-received")
        # The parameter server had the previous round's file before it sent that round's
        # update; deleting a model-sized file takes a while, so not on the sync's path.
        previous = self.work_dir / f"pseudo-gradients/round-{round_number - 1}.safetensors"
        threading.Thread(target=previous.unlink, kwargs={"missing_ok": True}, daemon=True).start()
        laps.lap("report")
        return SyncRound(answer, size, laps.parts)
