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

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.activation_checkpointing import measured, median_of, step_parser, step_shape

SIDES = ("glibc default", "threshold held")
# glibc's own starting threshold, 128 KiB, kept from growing.
MMAP_THRESHOLD = ("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))


def one_process(side: str, shape: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != MMAP_THRESHOLD[0]}
    if side == "threshold held":
        env[MMAP_THRESHOLD[0]] = MMAP_THRESHOLD[1]
    return measured("kept", shape, env, label=f"host-allocator: the {side} side")


def main(argv: list[str] | None = None) -> int:
    arguments = step_parser(__doc__.split("\n\n")[0], steps=5, repeats=3).parse_args(argv)
    shape = step_shape(arguments)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for turn in range(arguments.repeats):
        # The sides take turns going first, so that a busy spell falls on both.
        for side in SIDES if turn % 2 == 0 else SIDES[::-1]:
            runs[side].append(one_process(side, shape))
    medians = {side: median_of(processes) for side, processes in runs.items()}
    default, held = medians[SIDES[0]], medians[SIDES[1]]
    same_losses = default["losses"] == held["losses"]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": default["device"],
        "threads": default["threads"],
        "parameters": default["parameters"],
        "threshold": f"{MMAP_THRESHOLD[0]}={MMAP_THRESHOLD[1]}",
        "arguments": {k: v for k, v in vars(arguments).items() if k != "json"},
        "sides": medians,
        "peak_ratio": held["peak_bytes"] / default["peak_bytes"],
        "step_time_ratio": held["step_s"] / default["step_s"],
        "same_losses": same_losses,
    }
    what = "max-allocated" if default["device"].startswith("cuda") else "peak RSS"
    print(
        f"host allocator, {default['parameters'] / 1e6:.1f}M-parameter Llama ({arguments.layers} "
        f"layers of {arguments.hidden}), batch {arguments.batch}x{arguments.sequence} on "
        f"{default['device']} ({default['threads']} threads):"
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
