"""The executor's step compiled (HYPHA_COMPILE=on) against the same step eager, on this machine.

    python bench/compile_step.py [--shape demo|1M|10M|32M] [--batch N] [--steps N]
                                 [--repeats N] [--threads N] [--smoke] [--json PATH]

Both sides are the executor's own MicroBatchedStep (forward, backward, fused AdamW) on the same
GPT-2 shape from the same seed, on the same batches of random tokens (the local cluster's
vocabulary and 64-token sequences); the compiled side's model went through
`compiling.compile_model(..., "on")`, its blocks compiled in place. Each repeat times `--steps`
steps of each side in turn, after one warm-up step each; the figure is the median over the
repeats, and the ratio compiled over eager (above 1: compiling pays). The compiled side's first
step, which compiles, is timed apart with an empty inductor cache (a cold start) and reported
as its compile time. On a CUDA device the same comparison runs there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.models import DEMO, LARGE_32M, MEDIUM_10M, MICRO, SMALL_1M, Shape

SHAPES = {shape.name: shape for shape in (MICRO, DEMO, SMALL_1M, MEDIUM_10M, LARGE_32M)}
VOCABULARY, SEQUENCE = 512, 64


def stepper(shape: Shape, batch: int, compile: str) -> tuple[Any, Any]:
    """The executor's step over a fresh model of `shape`, compiled as asked; and the model."""
    import torch
    from accelerate import Accelerator

    from hypha.accelerate_executor.training.compiling import compile_model
    from hypha.accelerate_executor.training.distributed import Ranks
    from hypha.accelerate_executor.training.optimization import build_adamw
    from hypha.accelerate_executor.training.steps import MicroBatchedStep

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = shape.build(seed=0)
    optimizer = build_adamw(model.parameters(), {"lr": 1e-3}, accelerator.device, False)
    compiled = compile_model(model, compile, accelerator.device)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    names = ["input_ids", "labels"]
    step = MicroBatchedStep(
        accelerator, model, optimizer, Ranks(accelerator), batch, names, None,
        lambda line: print(line, file=sys.stderr), compiled,
    )  # fmt: skip
    return step, accelerator.device


def batches(count: int, batch: int, device: Any) -> list[dict[str, Any]]:
    import torch

    generator = torch.Generator().manual_seed(1)
    tokens = [
        torch.randint(0, VOCABULARY, (batch, SEQUENCE), generator=generator) for _ in range(count)
    ]
    return [{"input_ids": t.to(device), "labels": t.to(device)} for t in tokens]


def timed(step: Any, work: list[dict[str, Any]]) -> float:
    """Seconds for the steps over `work`, the device drained at both ends."""
    import torch

    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    synchronize()
    started = time.perf_counter()
    for batch in work:
        step(batch)
    synchronize()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1M")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    parser.add_argument("--smoke", action="store_true", help="the micro shape, 2 steps, 1 repeat")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args(argv)
    if arguments.smoke:
        arguments.shape, arguments.steps, arguments.repeats = "micro", 2, 1
    # A cold start: compile time as a fresh host sees it (the executor's image has a tmpfs cache).
    cache = tempfile.mkdtemp(prefix="compile-step-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    import torch

    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    shape = SHAPES[arguments.shape]
    eager, device = stepper(shape, arguments.batch, "off")
    compiled, _ = stepper(shape, arguments.batch, "on")
    work = batches(arguments.steps + 1, arguments.batch, device)
    timed(eager, work[:1])
    compile_seconds = timed(compiled, work[:1])
    if not compiled.compiled.active:
        print("the compiled side fell back to eager: nothing to compare", file=sys.stderr)
        return 1
    eager_s, compiled_s = [], []
    for _ in range(arguments.repeats):
        eager_s.append(timed(eager, work[1:]))
        compiled_s.append(timed(compiled, work[1:]))
    samples = arguments.steps * arguments.batch
    eager_rate = samples / statistics.median(eager_s)
    compiled_rate = samples / statistics.median(compiled_s)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "shape": shape.name,
        "batch": arguments.batch,
        "steps": arguments.steps,
        "repeats": arguments.repeats,
        "eager_samples_per_s": eager_rate,
        "compiled_samples_per_s": compiled_rate,
        "ratio": compiled_rate / eager_rate,
        "compile_seconds": compile_seconds,
        "eager_runs_s": eager_s,
        "compiled_runs_s": compiled_s,
    }
    print(
        f"compiled step, {shape.name} GPT-2, batch {arguments.batch}x{SEQUENCE} on {device} "
        f"({result['threads']} threads): {compiled_rate:.1f} samples/s against "
        f"{eager_rate:.1f} eager (median of {arguments.repeats} x {arguments.steps} steps), "
        f"ratio {result['ratio']:.3f}; first compiled step (cold cache) {compile_seconds:.1f} s"
    )
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
