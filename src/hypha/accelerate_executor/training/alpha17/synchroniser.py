"""One DiLoCo sync round over the Job Bridge, timed part by part.

Rank 0 writes theta_local - theta_global, sends it to the parameter server and reports
`update`; waits for the update u; adds it to theta_global, loads that into the model and
reports `update-received`. The other ranks only take part in the gather and the load.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

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
from hypha.accelerate_executor.training.distributed import ModelWeights

# In order. write: gather and write the pseudo-gradient; send: hand it to the bridge and
# report `update`; wait: for the parameter server; merge: theta_global += u; load: into
# the model; report: `update-received`.
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
        bridge: Alpha17Bridge | None,
        updates: PeersReference,
        results: PeersReference,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """Collects the starting weights (a collective) and, on rank 0 (the one with a
        bridge), opens the job's one receive stream."""
        self.weights = weights
        self.global_weights = GlobalWeights(weights.gather())
        self.bridge = bridge
        self.updates = updates
        self.dtype = dtype
        self.inbox = update_inbox(bridge, results) if bridge is not None else None

    def run(self, round_number: int) -> SyncRound:
        laps = Laps()
        local = self.weights.gather()  # a collective: every rank takes part
        if self.bridge is None or self.inbox is None:
            self.weights.load({})
            return SyncRound(answer=None)

        relative = f"pseudo-gradients/round-{round_number}.safetensors"
        size = self.global_weights.write_pseudo_gradient(
            local, self.bridge.work_dir / relative, self.dtype
        )
        del local
        laps.lap("write")
        self.bridge.send(self.updates, relative)  # never touched again
        expect(self.bridge.status("update"), Ok, sent="update")
        laps.lap("send")
        received = self.inbox.take()
        assert received is not None  # with no deadline, a file or the failure raised
        laps.lap("wait")
        self.global_weights.merge_update(received.path)
        laps.lap("merge")
        self.weights.load(self.global_weights.tensors)
        laps.lap("load")
        answer = self.bridge.status("update-received")
        expect(answer, Continue, Done, sent="update-received")
        # The parameter server had the previous round's file before it sent that round's
        # update; deleting a model-sized file takes a while, so not on the sync's path.
        previous = self.bridge.work_dir / f"pseudo-gradients/round-{round_number - 1}.safetensors"
        threading.Thread(target=previous.unlink, kwargs={"missing_ok": True}, daemon=True).start()
        laps.lap("report")
        return SyncRound(answer, size, laps.parts)
