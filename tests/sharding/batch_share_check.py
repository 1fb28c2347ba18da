"""The worker's batch shared by two DDP ranks, run under a real launcher by test_steps_shared.py.

    accelerate launch --num_processes 2 tests/sharding/batch_share_check.py MICRO

Batch 7 over 2 ranks (shares of 4 and 3, so a plain DDP average would weigh them wrong), in
micro-batches of MICRO (0: whole shares). After one SGD step of rate 1, every rank's weights
must have moved by exactly the gradient of the mean loss over all 7 samples, computed by an
unshared copy of the model. Prints `ok <rank>` and exits 0, or ends with an AssertionError.
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator

from hypha.accelerate_executor.entry import exit_without_teardown
from hypha.accelerate_executor.training.data import Share
from hypha.accelerate_executor.training.distributed import Ranks, process_group_settings
from hypha.accelerate_executor.training.steps import MicroBatchedStep

BATCH = 7


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank and in the reference
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.layers(x), labels)


def main(micro: int) -> None:
    generator = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(BATCH, 6, generator=generator),
             "labels": torch.randint(0, 3, (BATCH,), generator=generator)}  # fmt: skip

    reference = Classifier()
    reference(**batch).backward()
    expected = [p.grad.clone() for p in reference.parameters()]  # type: ignore[union-attr]

    accelerator = Accelerator(kwargs_handlers=[process_group_settings()])
    ranks = Ranks(accelerator)
    model = Classifier()
    before = [p.detach().clone() for p in model.parameters()]
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    share = Share.of(BATCH, ranks.index, ranks.count)
    mine = {name: t[share.start : share.start + share.size] for name, t in batch.items()}
    step = MicroBatchedStep(
        accelerator, model, optimizer, ranks, BATCH, ["x", "labels"], micro or None
    )
    loss = step(mine)
    total = accelerator.reduce(loss, reduction="sum")
    torch.testing.assert_close(total, reference(**batch).detach())
    after = accelerator.unwrap_model(model).parameters()
    for old, new, gradient in zip(before, after, expected, strict=True):
        torch.testing.assert_close(old - new.detach(), gradient, rtol=1e-5, atol=1e-6)
    print(f"ok {ranks.index}", flush=True)
    ranks.finish()


if __name__ == "__main__":
    main(int(sys.argv[1]))
    exit_without_teardown(0)  # the executor's way out of a process that ran collectives
