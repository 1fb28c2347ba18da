"""The same job with the scheduler's clock ahead of the workers' and behind: its time at each
skew as a ratio to no skew, measured in the same run. Target: at most 1.1x at every skew up
to 5 minutes either way (docs/protocol-actions.md, "Deadlines and clock skew").

    python bench/clock_skew.py [--skews 0,2,-2,15,-15,70,-70,300,-300] [--rounds N]
        [--steps-per-round N] [--repeats N] [--smoke]

Each run is the stand-in's coordinator with its scheduler's clock `skew` s ahead
(`RunOptions.scheduler_clock_skew_s`; negative: behind) and two `LocalWorker`s running the
executor as processes: 2 workers x 3 rounds of the causal-LM job (the demo GPT-2, 30 batches
of 8 a worker a round). A run's time is from the first `joined` to the last `terminate`
answer, counted at the workers' way to the coordinator: the executors' start-up comes before
any deadline and is left out. Each skewed run comes between two runs without skew, and its
ratio is over their mean, so that the machine's load drifting from run to run cancels; with
`--repeats`, the runs go in turns and each skew's ratio is the median of its runs'. Per skew:
the exit codes, whether each worker's last answer was `terminate`, the rounds aggregated,
the aggregates each worker applied, each run's time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from hypha.standin.coordinator.server import Catalog, RunOptions
from hypha.standin.data_service.assets import ensure_assets

# The pool and what it notes, shared with the clock-skew test.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from watched_pool import applied, run_pool

SKEWS = (0.0, 2.0, -2.0, 15.0, -15.0, 70.0, -70.0, 300.0, -300.0)
TARGET = 1.1
RUN_TIMEOUT_S = 600.0  # a run that has not ended by then is cancelled and reported


def one_run(catalog: Catalog, options: RunOptions, base: Path) -> dict[str, Any]:
    run = run_pool(catalog, options, base, RUN_TIMEOUT_S)
    seen = run.seen.values()
    begun = [s.joined_at for s in seen if s.joined_at is not None]
    ended = [s.ended_at for s in seen]
    finished = bool(begun) and all(at is not None for at in ended)
    return {
        "codes": "/".join(str(run.codes.get(name, "-")) for name in run.seen),
        "terminated": all(s.kinds and s.kinds[-1] == "terminate" for s in seen),
        "aggregated": len(run.summary["aggregations"]),
        "applied": "/".join(str(applied(s)) for s in seen),
        "seconds": max(at for at in ended if at is not None) - min(begun) if finished else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skews", default=",".join(f"{s:g}" for s in SKEWS), help="seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps-per-round", type=int, default=30, help="batches a worker")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each skew, in turns")
    parser.add_argument("--smoke", action="store_true", help="1 round of 3 steps, 0 and 70 s")
    arguments = parser.parse_args(argv)
    skews = [float(value) for value in arguments.skews.split(",")]
    rounds, steps, repeats = arguments.rounds, arguments.steps_per_round, arguments.repeats
    if arguments.smoke:
        rounds, steps, skews, repeats = 1, 3, [0.0, 70.0], 1
    skewed = [skew for skew in skews if skew != 0]
    # In turns, each skew's run between two baseline runs: its ratio is over their mean, so
    # that the machine's load drifting between runs cancels.
    order = [run for _ in range(repeats) for skew in skewed for run in (0.0, skew)] + [0.0]
    options = RunOptions(workers=2, rounds=rounds, steps_per_round=steps)
    catalog = Catalog.from_assets(ensure_assets(spec=options.asset_spec()))
    runs: dict[float, list[dict[str, Any]]] = {}
    timeline: list[tuple[float, float | None]] = []  # (skew, seconds) in the order run
    with (
        tempfile.TemporaryDirectory(prefix="hy-", dir="/tmp") as base,  # short socket paths
        contextlib.redirect_stdout(sys.stderr),  # the stand-in's and executors' own lines
    ):
        for index, skew in enumerate(order):
            work = Path(base) / str(index)
            work.mkdir()
            run_options = RunOptions(
                workers=2, rounds=rounds, steps_per_round=steps, scheduler_clock_skew_s=skew
            )
            result = one_run(catalog, run_options, work)
            runs.setdefault(skew, []).append(result)
            timeline.append((skew, result["seconds"]))
            print(f"skew {skew:+g} s: {result}", file=sys.stderr)
    baselines = [r["seconds"] for r in runs[0.0] if r["seconds"] is not None]
    ratios: dict[float, list[float | None]] = {}
    for index in range(1, len(timeline) - 1, 2):  # each skewed run between two baselines
        skew, seconds = timeline[index]
        around = [timeline[index - 1][1], timeline[index + 1][1]]
        known = [b for b in around if b is not None]
        ratio = seconds / (sum(known) / len(known)) if seconds is not None and known else None
        ratios.setdefault(skew, []).append(ratio)
    print(
        f"clock skew: 2 workers x {rounds} rounds of {options.target_samples} samples, "
        f"{options.job} job, {repeats} run(s) a skew, each between two runs without skew "
        f"({min(baselines, default=0):.1f}-{max(baselines, default=0):.1f} s); "
        f"target <= {TARGET}x"
    )
    print("| scheduler's clock | exit | terminate | aggregated | applied w1/w2 | s | vs no skew |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for skew in skewed:
        results = runs[skew]
        ended = [r["seconds"] for r in results if r["seconds"] is not None]
        known = [r for r in ratios[skew] if r is not None]
        ratio = statistics.median(known) if len(known) == len(ratios[skew]) else None
        worst = max(worst, ratio if ratio is not None else float("inf"))

        def each(key: str, results: list[dict[str, Any]] = results) -> str:
            return ", ".join(dict.fromkeys(str(r[key]) for r in results))

        way = "ahead" if skew > 0 else "behind"
        terminated = "yes" if all(r["terminated"] for r in results) else "no"
        aggregated = min(r["aggregated"] for r in results)
        print(
            f"| {abs(skew):g} s {way} | {each('codes')} | {terminated} | "
            f"{aggregated} of {rounds} | {each('applied')} | "
            f"{', '.join(f'{s:.1f}' for s in ended) or '-'} | "
            f"{'did not end' if ratio is None else f'{ratio:.2f}'} |"
        )
    if skewed:
        print(f"worst {worst:.2f}x (target <= {TARGET}x: {'met' if worst <= TARGET else 'GAP'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
