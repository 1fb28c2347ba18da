"""The GPU acceptance run's eager and compiled parts side by side, from their selftest JSON.

    python bench/gpu_acceptance/compile_table.py DIR

For each pair that ran (selftest and selftest-compiled, fsdp and fsdp-compiled): samples/s,
tokens/s, the ratio to the bare eager loop measured in the same part, MFU, peak memory, the
first round's extra seconds (compiling and warm-up) and the losses; then compiled over eager.
Prints nothing where no pair ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PAIRS = (("selftest", "selftest-compiled"), ("fsdp", "fsdp-compiled"))
GIB = 1 << 30


def number(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def row(name: str, data: dict[str, Any]) -> str:
    figures = data["figures"]
    rounds = (data.get("executor") or {}).get("rounds") or {}
    losses = [
        m["loss"] for _, m in sorted(rounds.items(), key=lambda kv: int(kv[0])) if "loss" in m
    ]
    mfu = figures.get("executor_mfu")
    memory = figures.get("executor_peak_memory_bytes")
    return (
        f"{name:<18} {number(figures.get('executor_samples_per_s'), '.1f'):>9} "
        f"{number(figures.get('executor_tokens_per_s'), ',.0f'):>10} "
        f"{number(figures.get('ratio'), '.3f'):>8} "
        f"{'-' if mfu is None else f'{100 * mfu:.1f} %':>7} "
        f"{'-' if memory is None else f'{memory / GIB:.2f} GiB':>10} "
        f"{number(figures.get('first_round_extra_s'), '.1f'):>9} "
        f"{' -> '.join(f'{x:.4f}' for x in losses[:1] + losses[-1:]) or '-'}"
    )


def main(folder: Path) -> int:
    lines = []
    for eager_name, compiled_name in PAIRS:
        paths = [folder / f"{name}.json" for name in (eager_name, compiled_name)]
        if not all(path.is_file() for path in paths):
            continue
        eager, compiled = (json.loads(path.read_text()) for path in paths)
        lines += [row(eager_name, eager), row(compiled_name, compiled)]
        rates = [d["figures"].get("executor_samples_per_s") for d in (eager, compiled)]
        if all(rates):
            lines.append(f"{'':<18} compiled / eager: {rates[1] / rates[0]:.3f}")
    if lines:
        print("== eager and compiled (the bare loop, eager, is each part's baseline)")
        print(
            f"{'part':<18} {'samples/s':>9} {'tokens/s':>10} {'vs bare':>8} {'MFU':>7} "
            f"{'peak mem':>10} {'1st rnd+':>9} loss first -> last"
        )
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
