"""The least a process can do to train a job's DiLoCo rounds over the Job Bridge, by hand.

The rounds benchmark's baseline: what the executor would cost if it were nothing but a
PyTorch loop and the protocol. No accelerate, no micro-batches, no prefetching, no checks.
Each batch is cut from the current slice (slices fetched when the last one runs out), one
`status` per batch goes out on a small pool of threads (so a late answer never stops a
step, as in the executor), and ScheduleUpdate{k} ends the round k batches after the batch
it answers. The sync is `save_file` of theta_local - theta_global, `send`, `update`, the
wait on the one receive stream, `load_file` of the update, theta_global += u,
`load_state_dict`, `update-received`.

    JOB_JSON=... python bench/bare_executor.py --socket S --work-dir W [--eval-mode]

`--eval-mode` leaves the model in the eval mode from_pretrained gives it, as Hypha's own
executor does: dropout off.

Each round prints one line the benchmark reads, its parts as the executor's round line
says them: wall time of the round's parts, `cpu` the process's CPU time (all threads)
while it trained.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import torch
from safetensors.torch import load_file, save_file

from hypha.accelerate_executor.protocol.alpha17.job import parse_job
from hypha.accelerate_executor.protocol.alpha17.messages import (
    Continue,
    Done,
    ScheduleUpdate,
    batch_status,
)
from hypha.accelerate_executor.training.alpha17.bridge import Alpha17Bridge
from hypha.accelerate_executor.training.modeling import load_model
from hypha.accelerate_executor.training.optimization import adamw_arguments, build_lr_schedule
from hypha.accelerate_executor.training.settings import switch

STATUS_SENDERS = 8


def timing_line(round_number: int, parts: dict[str, float]) -> str:
    """As the executor's round line says them: `round N: ... | step 612.3 ms, data ...`."""
    return f"round {round_number}: | " + ", ".join(
        f"{name} {1e3 * seconds:.1f} ms" for name, seconds in parts.items()
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--eval-mode", action="store_true")
    arguments = parser.parse_args()
    job = parse_job(os.environ["JOB_JSON"])
    config = job.config
    bridge = Alpha17Bridge(arguments.socket, arguments.work_dir)
    bridge.fetch(config.model.artifact)
    # As the executor decides it: the near-free model ships its own code.
    trusted = switch(os.environ.get("HYPHA_TRUST_REMOTE_CODE") or "off")
    model = load_model(config.model.task, arguments.work_dir / "artifacts", trusted)
    model.train(not arguments.eval_mode)
    optimizer = torch.optim.AdamW(model.parameters(), **adamw_arguments(job))
    schedule = build_lr_schedule(optimizer, config.scheduler)
    names = config.model.input_names
    theta_global = {name: t.detach().clone() for name, t in model.state_dict().items()}
    updates = bridge.receive(config.results)  # the job's one receive stream, opened first
    senders = ThreadPoolExecutor(STATUS_SENDERS)
    pending: list[tuple[int, Future[object]]] = []
    slice_: dict[str, torch.Tensor] = {}
    cursor = trained = 0
    batch_size = config.batch_size

    for round_number in range(1, sys.maxsize):
        parts = dict.fromkeys(("data", "step", "statuses"), 0.0)
        cpu, last_batch, first = time.process_time(), None, trained
        while last_batch is None or trained < last_batch:
            started = time.perf_counter()
            if cursor + batch_size > len(next(iter(slice_.values()), ())):
                [entry] = bridge.fetch(config.data)
                slice_ = {name: tensor for name, tensor in load_file(entry.path).items()}
                cursor = 0
            batch = {name: slice_[name][cursor : cursor + batch_size] for name in names}
            cursor += batch_size
            stepped = time.perf_counter()
            model(**batch).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            trained += 1
            reported = time.perf_counter()
            pending.append((trained, senders.submit(bridge.status, batch_status(batch_size))))
            for batch_number, future in [p for p in pending if p[1].done()]:
                pending.remove((batch_number, future))
                answer = future.result()
                if isinstance(answer, ScheduleUpdate) and last_batch is None:
                    last_batch = batch_number + answer.counter
            parts["data"] += stepped - started
            parts["step"] += reported - stepped
            parts["statuses"] += time.perf_counter() - reported
        started = time.perf_counter()
        for _, future in pending:  # no status may be in flight at `update`
            future.result()
        pending.clear()
        parts["statuses"] += time.perf_counter() - started
        parts["cpu"] = time.process_time() - cpu
        batches = trained - first

        clock = time.perf_counter()
        relative = f"round-{round_number}.safetensors"
        local = model.state_dict()
        save_file(
            {name: local[name] - theta_global[name] for name in theta_global},
            arguments.work_dir / relative,
        )
        parts["write"] = time.perf_counter() - clock
        bridge.send(config.updates, relative)
        bridge.status("update")
        parts["send"] = time.perf_counter() - clock - parts["write"]
        received = next(updates)
        parts["wait"] = time.perf_counter() - clock - parts["write"] - parts["send"]
        merged = time.perf_counter()
        for name, update in load_file(received.path).items():
            theta_global[name] += update
        model.load_state_dict(theta_global)
        parts["merge_load"] = time.perf_counter() - merged
        answer = bridge.status("update-received")
        print(f"{timing_line(round_number, parts)} | {batches} batches", flush=True)
        if isinstance(answer, Done):
            return 0
        if not isinstance(answer, Continue):
            print(f"bare executor: unexpected answer {answer}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
