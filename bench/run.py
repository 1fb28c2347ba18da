"""Runs the executor's performance benchmarks; prints a table, writes JSON and a plot.

    python bench/run.py [--quick] [--out DIR] [--only inner,data,sync,pseudo,status]

Every claim is a ratio against a baseline measured in the same run:
  inner   executor samples/s (real job, local cluster, 1 worker) vs a bare PyTorch loop
  data    load_slice + worker_batches vs a per-sample Dataset + default_collate, and vs training speed
  sync    one DiLoCo sync round (waiting excluded) vs one safetensors save_file, 1M-100M
  pseudo  the local demo with fp32 and with bf16 pseudo-gradients: bytes per round, loss
  status  executor samples/s with the scheduler's answers 20 and 100 ms late vs on time,
          and the batches trained past ScheduleUpdate because of it
Progress goes to stderr, the table to stdout. Full size takes four to five minutes on 2
cores: run it on a quiet machine. The notes under the table say when it was not (the
load average, and the share of the CPU other processes took during each benchmark).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

if __name__ == "__main__" and not __package__:
    # `python bench/run.py` puts bench/ first on sys.path; the `bench` package needs its parent.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import (
    data_path,
    inner_loop,
    pseudo_gradient,
    report,
    rounds,
    status_delay,
    step_overhead,
    sync_round,
)
from bench.data_path import SliceShape
from bench.errors import BenchError
from bench.models import DEMO, HUGE_100M, LARGE_32M, MEDIUM_10M, MICRO, SMALL_1M, Shape
from bench.timing import machine_cpu_seconds, own_cpu_seconds
from hypha.accelerate_executor.entry import OneLineArgumentParser
from hypha.accelerate_executor.errors import UsageError
from hypha.standin.coordinator.server import RunOptions

BENCHMARKS = ("inner", "data", "sync", "pseudo", "status", "rounds", "overhead")
# A load average above this at the start is worth a warning before anything runs.
QUIET_LOAD = 1.0
# Other processes' share of the machine's CPU during a benchmark above which it is flagged.
QUIET_SHARE = 0.05
T = TypeVar("T")


@dataclass(frozen=True)
class Size:
    inner_cases: tuple[tuple[Shape, int, int], ...]  # (model, steps per round, repeats)
    inner_rounds: int
    slices: tuple[SliceShape, ...]
    data_repeats: int
    sync_shapes: tuple[Shape, ...]
    sync_rounds: int
    sync_dtypes: tuple[str, ...]
    demo: RunOptions = field(default_factory=RunOptions)
    batch_size: int = 8
    # One worker; lead 1 so a late ScheduleUpdate shows as overshoot.
    status: RunOptions = field(
        default_factory=lambda: RunOptions(
            workers=1, rounds=5, steps_per_round=40, generation="alpha17"
        )
    )
    status_repeats: int = 3
    # 2 workers on the 2 cores, rounds of 15 batches each: where per-round costs show.
    short_rounds: RunOptions = field(
        default_factory=lambda: RunOptions(
            workers=2, rounds=5, steps_per_round=15, generation="alpha17"
        )
    )
    rounds_repeats: int = 3
    rounds_delays_ms: tuple[int, ...] = rounds.DELAYS_MS
    overhead_blocks: tuple[int, int] = (15, 200)  # blocks, steps per block


DEMO_SLICE = SliceShape(64, 64)  # the local cluster's slices
SIZES = {
    "full": Size(
        # One 32M repeat takes a minute; the demo's gap is smaller than the machine's drift.
        inner_cases=((DEMO, 60, 5), (LARGE_32M, 6, 1)),
        inner_rounds=4,
        slices=(DEMO_SLICE, SliceShape(4096, 512)),
        data_repeats=15,
        sync_shapes=(SMALL_1M, MEDIUM_10M, HUGE_100M),
        sync_rounds=5,
        sync_dtypes=("float32", "bfloat16"),
    ),
    "quick": Size(
        inner_cases=((DEMO, 20, 1), (MEDIUM_10M, 4, 1)),
        inner_rounds=3,
        slices=(DEMO_SLICE, SliceShape(1024, 256)),
        data_repeats=5,
        sync_shapes=(SMALL_1M, MEDIUM_10M, HUGE_100M),
        sync_rounds=3,
        sync_dtypes=("float32", "bfloat16"),
        demo=RunOptions(workers=2, rounds=3, steps_per_round=15, generation="alpha17"),
        status=RunOptions(workers=1, rounds=3, steps_per_round=30, generation="alpha17"),
        status_repeats=1,
        rounds_repeats=1,
        overhead_blocks=(5, 100),
    ),
    # For the test suite: proves every benchmark runs end to end, measures nothing useful.
    "smoke": Size(
        inner_cases=((DEMO, 3, 1),),
        inner_rounds=2,
        slices=(DEMO_SLICE,),
        data_repeats=2,
        sync_shapes=(MICRO,),
        sync_rounds=1,
        sync_dtypes=("float32",),
        demo=RunOptions(workers=2, rounds=2, steps_per_round=3, generation="alpha17"),
        status=RunOptions(workers=1, rounds=2, steps_per_round=4, generation="alpha17"),
        status_repeats=1,
        short_rounds=RunOptions(workers=2, rounds=2, steps_per_round=3, generation="alpha17"),
        rounds_repeats=1,
        rounds_delays_ms=(0,),
        overhead_blocks=(1, 5),
    ),
}


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = OneLineArgumentParser(
        prog="bench/run.py",
        description="Performance benchmarks of the executor, each against a same-run baseline.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_const",
        const="quick",
        dest="size",
        help="smaller models and fewer repeats (a few minutes)",
    )
    size.add_argument(
        "--smoke",
        action="store_const",
        const="smoke",
        dest="size",
        help="tiny sizes that only prove the benchmarks run (the test suite's)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="folder for results.json, performance.png and the demo runs' "
        "outputs (default bench/results/)",
    )
    parser.add_argument(
        "--only",
        type=_benchmark_list,
        default=BENCHMARKS,
        metavar="NAME[,NAME]",
        help=f"run only these of {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=("no", "bf16"),
        default="no",
        help="the inner loop's precision, for the executor (accelerate's setting) and the bare "
        "loop (autocast) alike; both run on the GPU when there is one",
    )
    parser.add_argument(
        "--against",
        action="append",
        type=_against,
        default=[],
        metavar="NAME=PATH",
        help="rounds: also run another executor on the same job, and say how this one compares: "
        "PATH is a Python whose environment holds it (Hypha's own) or a source tree whose src/ "
        "does (an earlier commit of this project); may be given more than once",
    )
    parser.set_defaults(size="full")
    return parser.parse_args(argv)  # fmt: skip


def _benchmark_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark {', '.join(unknown) or 'list'}; choose from {', '.join(BENCHMARKS)}"
        )
    return names


def _against(text: str) -> tuple[str, Path]:
    name, _, path = text.partition("=")
    if not name or not path or name in (rounds.BASELINE, rounds.EXECUTOR):
        raise argparse.ArgumentTypeError(
            f"--against {text!r}: give NAME=PATH, NAME neither {rounds.BASELINE} nor "
            f"{rounds.EXECUTOR}"
        )
    return name, Path(path)


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def timed(title: str, action: Callable[[], T], others: dict[str, float]) -> T:
    """Runs one benchmark; records in `others` the share of the machine's CPU that other
    processes took meanwhile (what this process and its children used is not counted)."""
    progress(f"{title} ...")
    started, machine, own = time.perf_counter(), machine_cpu_seconds(), own_cpu_seconds()
    result = action()
    wall = time.perf_counter() - started
    machine_after = machine_cpu_seconds()
    if machine is not None and machine_after is not None:
        used_by_others = machine_after - machine - (own_cpu_seconds() - own)
        others[title] = max(0.0, used_by_others / (wall * (os.cpu_count() or 1)))
    progress(f"{title}: {wall:.1f} s")
    return result


def run(
    size_name: str,
    only: tuple[str, ...],
    out: Path,
    command: str,
    mixed_precision: str = "no",
    against: dict[str, Path] | None = None,
) -> int:
    size = SIZES[size_name]
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    if load_before > QUIET_LOAD:
        progress(f"the load average is {load_before:.2f}: other work competes, ratios may be off")
    inner: list[inner_loop.InnerLoopResult] = []
    data: list[data_path.DataPathResult] = []
    sync: list[sync_round.SyncResult] = []
    pseudo: list[pseudo_gradient.DtypeRun] = []
    status: list[status_delay.StatusDelayResult] = []
    short_rounds: list[rounds.RoundsResult] = []
    overhead: list[step_overhead.StepOverheadResult] = []
    others: dict[str, float] = {}
    scratch = Path(tempfile.mkdtemp(prefix="hypha-bench-"))  # short: socket paths live here
    try:
        if "data" in only:
            data = timed(
                "data path",
                lambda: data_path.run(
                    scratch, list(size.slices), size.batch_size, size.data_repeats
                ),
                others,
            )
        if "sync" in only:
            sync = timed(
                "sync round",
                lambda: sync_round.run(
                    scratch, list(size.sync_shapes), size.sync_rounds, size.sync_dtypes
                ),
                others,
            )
        if "inner" in only:
            inner = timed(
                "inner loop",
                lambda: inner_loop.run(
                    scratch / "inner",
                    list(size.inner_cases),
                    size.inner_rounds,
                    1800.0,
                    mixed_precision,
                ),
                others,
            )
        if "pseudo" in only:
            pseudo = timed(
                "pseudo-gradient dtypes",
                lambda: pseudo_gradient.run(out, scratch / "pseudo", size.demo),
                others,
            )
        if "status" in only:
            status = timed(
                "status delay",
                lambda: status_delay.run(
                    scratch / "status", DEMO, size.status, size.status_repeats
                ),
                others,
            )
        if "rounds" in only:
            short_rounds = [
                timed(
                    "short rounds",
                    lambda: rounds.run(
                        scratch / "rounds",
                        size.short_rounds,
                        size.rounds_repeats,
                        against,
                        size.rounds_delays_ms,
                    ),
                    others,
                ),
                # With dropout, which Hypha's own executor never turns on (rounds.MODELS).
                timed(
                    "short rounds, dropout",
                    lambda: rounds.run(
                        scratch / "rounds",
                        size.short_rounds,
                        size.rounds_repeats,
                        against,
                        delays_ms=(0,),
                        model=rounds.DROPOUT_MODEL,
                    ),
                    others,
                ),
                # The same rounds with a step that costs nothing: what is left is the
                # executors' own work per round (statuses, sync, bookkeeping).
                timed(
                    "short rounds, near-free model",
                    lambda: rounds.run(
                        scratch / "rounds",
                        size.short_rounds,
                        size.rounds_repeats,
                        delays_ms=(0,),
                        model="near-free",
                    ),
                    others,
                ),
            ]
        if "overhead" in only:
            overhead = [
                timed("step overhead", lambda: step_overhead.run(*size.overhead_blocks), others)
            ]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]

    fastest_training = max((r.bare_steps_per_s for r in inner), default=None)
    rows = [
        *report.inner_loop_rows(inner),
        *report.data_path_rows(data, fastest_training),
        *report.sync_round_rows(sync),
        *report.pseudo_gradient_rows(pseudo),
        *report.status_delay_rows(status),
        *report.rounds_rows(short_rounds),
        *report.step_overhead_rows(overhead),
    ]
    print(report.table(rows))
    notes = _notes(inner, sync, load_before, load_after, others)
    notes += _rounds_notes(short_rounds, overhead)
    for note in notes:
        print(f"note: {note}")
    report.write_json(
        out / "results.json",
        {
            "command": command,
            "size": size_name,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": _machine(load_before, load_after),
            "rows": [row.as_json() for row in rows],
            "notes": notes,
            "cpu_share_of_other_processes": others,
            "inner_loop": [
                _with(r, "executor_samples_per_s", "bare_samples_per_s", "ratio") for r in inner
            ],
            "data_path": [
                _with(r, "executor_batches_per_s", "naive_batches_per_s", "speedup") for r in data
            ],
            "sync_round": [_with(r, "ratio") for r in sync],
            "pseudo_gradient": [asdict(r) for r in pseudo],
            "status_delay": [_with(r, "median_samples_per_s") for r in status],
            "short_rounds": [r.as_json() for r in short_rounds],
            "step_overhead": [_with(r, "overhead_us") for r in overhead],
        },
    )
    report.plot(out / "performance.png", inner, sync)
    print(f"wrote {out / 'results.json'} and {out / 'performance.png'}")
    return 0


def _with(result: Any, *properties: str) -> dict[str, Any]:
    """The result's fields and the named derived figures."""
    return {**asdict(result), **{name: getattr(result, name) for name in properties}}


def _notes(
    inner: list[inner_loop.InnerLoopResult],
    sync: list[sync_round.SyncResult],
    load_before: float,
    load_after: float,
    others: dict[str, float],
) -> list[str]:
    notes = [f"load average {load_before:.2f} at the start, {load_after:.2f} at the end"]
    for title, share in others.items():
        if share > QUIET_SHARE:
            notes.append(
                f"other processes took {share:.0%} of the machine's CPU during the {title} "
                "benchmark: its ratios are suspect, run it again on a quiet machine"
            )
    for result in inner:
        notes.append(
            f"inner loop {result.model}: the local bridge and coordinator (this process) used "
            f"{result.stand_in_cpu_ms_per_step:.1f} ms CPU per executor step on the same cores; "
            f"a bare step takes {1e3 / result.bare_steps_per_s:.1f} ms"
        )
        if len(result.repeat_ratios) > 1:
            ratios = ", ".join(f"{ratio:.3f}" for ratio in result.repeat_ratios)
            notes.append(
                f"inner loop {result.model}: ratios of {len(result.repeat_ratios)} repeats "
                f"{ratios}; the row is the median one"
            )
        low, high = min(result.bare_samples_per_s), max(result.bare_samples_per_s)
        if high > 1.1 * low:
            notes.append(
                f"inner loop {result.model}: the bare loop ran at {low:.1f} and {high:.1f} samples/s "
                "before and after the executor; the machine's speed drifted"
            )
    for round_ in sync:
        parts = ", ".join(f"{part} {s * 1e3:.1f}" for part, s in round_.parts_s.items())
        notes.append(
            f"sync round {round_.model} {round_.dtype}: {parts} ms (medians of {round_.rounds}); "
            f"one status round trip through the bridge {round_.round_trip_s * 1e3:.1f} ms; "
            f"waiting for the parameter server {round_.waiting_s * 1e3:.1f} ms, not counted"
        )
        # send and report are bridge exchanges; the rest is the executor's own work.
        own_s = sum(round_.parts_s.get(part, 0.0) for part in ("write", "merge", "load"))
        notes.append(
            f"sync round {round_.model} {round_.dtype}: write, merge and load alone "
            f"{own_s * 1e3:.1f} ms, {own_s / round_.save_file_s:.2f}x the save_file"
        )
    return notes


def _rounds_notes(
    short_rounds: list[rounds.RoundsResult], overhead: list[step_overhead.StepOverheadResult]
) -> list[str]:
    notes = []
    for result in short_rounds:
        for delay in result.delays_ms:
            for name in result.executors:
                split = ", ".join(
                    f"{part} {1e3 * s:.0f}" for part, s in result.split(delay, name).items()
                )
                cpu = statistics.median(r.cpu_ms_per_batch for r in result.runs[delay][name])
                notes.append(
                    f"short rounds {result.model} +{delay} ms, {name}: per round and worker (medians, ms) "
                    f"{split}; CPU {cpu:.1f} ms a batch, all its threads"
                )
    for result in short_rounds:
        if rounds.BARE_EVAL in result.executors:
            eval_mode = result.ratio(0, rounds.BARE_EVAL, rounds.BASELINE)
            notes.append(
                f"short rounds {result.model}: the bare loop in eval mode (dropout off, as Hypha's "
                f"own executor trains) runs at {eval_mode:.2f}x the same loop in train mode; "
                "executors that train in eval mode gain that much over those that do not"
            )
        if result.model == "near-free":
            per_round = {
                name: statistics.median(r.cpu_ms_per_round for r in result.runs[0][name])
                for name in result.executors
            }
            notes.append(
                "short rounds, near-free model: CPU per round and worker "
                + ", ".join(f"{name} {ms:.1f} ms" for name, ms in per_round.items())
                + f"; the executor's beyond the bare loop's {per_round[rounds.EXECUTOR] - per_round[rounds.BASELINE]:.1f} ms"
            )
    for steps in overhead:
        notes.append(
            f"step overhead: {steps.overhead_us:.0f} us of host CPU a step beyond the bare "
            f"loop's (median of {steps.blocks} blocks of {steps.steps_per_block} steps)"
        )
    return notes


def _machine(load_before: float, load_after: float) -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": round(load_before, 2),
        "load_average_end": round(load_after, 2),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        arguments = parse_arguments(argv)
        command = " ".join(["python bench/run.py", *argv])
        return run(
            arguments.size,
            arguments.only,
            arguments.out,
            command,
            arguments.mixed_precision,
            dict(arguments.against),
        )
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except UsageError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return exc.exit_code
    except (BenchError, OSError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the executor's and local cluster's own errors are one line too
        if os.environ.get("HYPHA_DEBUG"):
            traceback.print_exc()
        summary = " ".join(str(exc).split())[:500]
        print(f"bench: failed: {type(exc).__name__}: {summary}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
