"""The teardown race that aborted finished ranks, with its window held open.

    torchrun --nproc_per_node 2 bench/exit_race.py teardown|product

Run by exit_repetition.py (paths race-teardown and race). Rank 0 starts a broadcast of a
tensor made in Python and drops its own references to it (the gloo work then holds the last
one); rank 1 joins the broadcast a quarter second later, well inside rank 0's sort (about
1 s of a 3M-element list), which must outlast it. Rank 0's gloo worker thread then frees the
tensor, which takes the GIL, while rank 0's main thread holds the GIL in one C call (a sort)
on its way out. `teardown` leaves with sys.exit, as the executor did, the sort being the last
atexit function (registered first), so that finalization starts as the sort ends: the worker
is still waiting for the GIL, CPython ends it with pthread_exit, the unwinding meets a C++
destructor, and the rank aborts ("terminate called without an active exception"). `product`
sorts, then leaves through entry.exit_without_teardown, as the executor does now. In the real
job the window is the instant a loaded machine keeps a worker from running; here the sort.
"""

from __future__ import annotations

import atexit
import random
import sys
import time

HOLD = list(range(3_000_000))
random.shuffle(HOLD)
atexit.register(sorted, HOLD)  # registered first, run last: the GIL held until finalization

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hypha.accelerate_executor.entry import exit_without_teardown  # noqa: E402

# Shorter than the sort by far: at 1 s it was a coin flip on a quiet machine (the sort took
# 0.96-1.07 s), and rank 0 left before rank 1 had sent, failing rank 1's wait.
PEER_DELAY_S = 0.25


def main(how: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    tensor = torch.ones(16)
    if rank == 1:
        time.sleep(PEER_DELAY_S)
    work = dist.broadcast(tensor, src=1, async_op=True)
    if rank == 1:
        work.wait()
    del work, tensor
    print(f"exit-race: rank {rank} done", flush=True)
    if how == "product":
        sorted(HOLD)  # the same hold, then the executor's way out
        exit_without_teardown(0)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
