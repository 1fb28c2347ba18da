"""The executor's training step with glibc's mmap threshold held where it starts
(MALLOC_MMAP_THRESHOLD_=131072, which an operator may give the launcher's environment; the
ranks inherit it) against glibc's default, which raises the threshold as large blocks are
freed: the peak resident set and the step time each gets.

    python bench/host_allocator.py [--layers N] [--hidden N] [--batch N] [--sequence N]
                                   [--steps N] [--repeats N] [--smoke] [--json PATH]

Each side is one process of bench/activation_checkpointing.py's kept case (the executor's
MicroBatchedStep, forward, backward and fused AdamW over a Llama of random init, on one batch
of random tokens), the same shape, seed and batch on both sides; the sides differ only in
MALLOC_MMAP_THRESHOLD_ in their environment. With --repeats the sides take turns, and each
side's figures are the median over its processes. On the CPU the peak is VmHWM; on a GPU
the device's max-allocated, which no host allocator moves, so there the peak ratio is 1 and
only the step time says anything. Ratios are held over glibc's default: below 1 for memory
is what holding the threshold saves, above 1 for time what it costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEP = Path(__file__).resolve().parent / "activation_checkpointing.py"
SIDES = ("glibc default", "threshold held")
# glibc's own starting threshold, 128 KiB, kept from growing.
MMAP_THRESHOLD = ("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))


def one_process(side: str, shape: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != MMAP_THRESHOLD[0]}
    if side == "threshold held":
        env[MMAP_THRESHOLD[0]] = MMAP_THRESHOLD[1]
    done = subprocess.run(
        [sys.executable, str(STEP), *shape, "--case", "kept"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"host-allocator: the {side} side failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="processes a side, in turns")
    parser.add_argument("--smoke", action="store_true", help="2 layers of 64, 2 x 32 tokens")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args(argv)
    if arguments.smoke:
        arguments.layers, arguments.hidden, arguments.batch = 2, 64, 2
        arguments.sequence, arguments.steps, arguments.repeats = 32, 1, 1
    shape = [
        f"--layers={arguments.layers}", f"--hidden={arguments.hidden}", f"--batch={arguments.batch}",
        f"--sequence={arguments.sequence}", f"--steps={arguments.steps}",
    ]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for turn in range(arguments.repeats):
        # The sides take turns going first, so that a busy spell falls on both.
        for side in SIDES if turn % 2 == 0 else SIDES[::-1]:
            runs[side].append(one_process(side, shape))
    medians = {
        side: {name: statistics.median(run[name] for run in processes)
               for name in ("peak_bytes", "before_steps_bytes", "step_s")}
        for side, processes in runs.items()
    }  # fmt: skip
    default, held = medians[SIDES[0]], medians[SIDES[1]]
    first = runs[SIDES[0]][0]
    same_losses = runs[SIDES[0]][0]["losses"] == runs[SIDES[1]][0]["losses"]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": first["device"],
        "threads": first["threads"],
        "parameters": first["parameters"],
        "threshold": f"{MMAP_THRESHOLD[0]}={MMAP_THRESHOLD[1]}",
        "arguments": {k: v for k, v in vars(arguments).items() if k != "json"},
        "sides": medians,
        "peak_ratio": held["peak_bytes"] / default["peak_bytes"],
        "step_time_ratio": held["step_s"] / default["step_s"],
        "same_losses": same_losses,
    }
    what = "max-allocated" if first["device"].startswith("cuda") else "peak RSS"
    print(
        f"host allocator, {first['parameters'] / 1e6:.1f}M-parameter Llama ({arguments.layers} "
        f"layers of {arguments.hidden}), batch {arguments.batch}x{arguments.sequence} on "
        f"{first['device']} ({first['threads']} threads):"
    )
    for side, figures in medians.items():
        print(
            f"  {side:>14}: {what} {figures['peak_bytes'] / 1e9:.2f} GB "
            f"({figures['before_steps_bytes'] / 1e9:.2f} GB before the first step), step "
            f"{figures['step_s']:.3f} s (median of {arguments.steps} x {arguments.repeats})"
        )
    print(
        f"  ratio held/default ({result['threshold']}): peak {result['peak_ratio']:.3f}, step "
        f"time {result['step_time_ratio']:.3f}; losses {'identical' if same_losses else 'DIFFER'}"
    )
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0 if same_losses else 1


if __name__ == "__main__":
    sys.exit(main())
