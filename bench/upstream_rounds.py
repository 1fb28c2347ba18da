"""Rounds against the stand-in playing upstream's order (its parameter server's broadcast
over once the push is on every bridge, so a worker that sent is told `execute-batch`, not
`apply-update`): 2 workers x 3 rounds of the demo GPT-2, the scheduler's answers at once or
late, the speculative step off, on and auto, equal speeds or one worker slower; with
`--upstream`, the same pool with both workers running Hypha's own executor (upstream's
`executors/accelerate`, installed by bench/install_upstream_executor.sh), and every row on the
demo GPT-2 with untied embeddings (upstream's cannot apply an update to tied ones).

    python bench/upstream_rounds.py [--rounds N] [--steps-per-round N] [--smoke]
        [--upstream PYTHON [--upstream-only]]

Each run is the stand-in's coordinator (its scheduler and parameter server as upstream's
decide) with two `LocalWorker`s running the executor as processes, each job's bridge reaching
the coordinator through a wrapper that holds each answer back (`--delays`, ms) and notes every
status and answer. "Unequal" holds w2's answers 40 ms more than w1's: to the scheduler w2 is
the slower worker (its per-batch time is longer), which is what unequal speeds change.

Per run: each round's duration (from the statuses: the scheduler's round as each `sent-update`
states it), applied updates per worker (its executor's own round in its last `sent-update`,
plus a final `applied-update`), broadcasts missed (a `sent-update` whose executor round is
behind the scheduler's), `execute-batch{0}` answers, samples the scheduler counted
(`batch-completed`) against those the executor trained (`sent-update`'s batches), and real
samples/s (trained samples from the first `joined` to the last round's last `sent-update`). The ratio is each run's samples/s over
the speculative-off run of the same delay and speeds, measured in the same invocation.

A round is 75 steps a worker of batch 8 by default: upstream's default job's 1,200 samples
between updates, so that `auto` (a warm-up turn and a trial of 40 batches before it keeps a
way, training/actions/speculative.py) runs most of the job the way it chose.

Upstream's executor reports less, so three figures are derived for its rows from what its
training loop does (hypha-space/hypha executors/accelerate/.../training.py, index id
66429791419): a `batch-completed` without `batches` counts one batch, as the stand-in's
scheduler reads it; trained samples are the batches of the `execute-batch` answers it got
before each `sent-update` (it trains exactly that many; its metrics hold only the loss); its
`sent-update` round is 1 + the updates it applied, and only an `applied-update` that answers
`apply-update` is one (after `execute-batch{0}` it repeats its last status, whatever it was).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.rounds import MODELS
from hypha.standin.actions.coordinator import ActionCoordinator
from hypha.standin.coordinator.client import CoordinatorClient, JobBackend
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry, preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

BATCH_SIZE = 8
SPECULATIVE = ("off", "on", "auto")  # off first: the ratios' baseline
SLOWER_MS = 40  # unequal: w2's answers this much later than w1's
UPSTREAM = "upstream"  # the speculative column for upstream's executor, which has no such step


def upstream_entry(python: Path) -> ExecutorEntry:
    """Upstream's executor as its worker config launches it (`--job {JOB_JSON}` on the command
    line), less `accelerate launch`: one CPU process needs no launcher."""
    module = ("-m", "hypha.accelerate_executor.training", *EXECUTOR_ARGS, "--job", "{JOB_JSON}")
    return ExecutorEntry(str(python), module, as_owner=True)


@dataclass
class Tally:
    """One worker's statuses and answers."""

    zero_answers: int = 0
    counted: int = 0  # samples in batch-completed
    trained: int = 0  # samples in sent-update's batches
    sends: list[tuple[float, int, int]] = field(default_factory=list)  # (t, scheduler, own)
    applied_after_last_send: bool = False
    first_at: float | None = None  # its executor's `joined`: start-up left out
    upstream: bool = False  # upstream's executor: figures derived (module docstring)
    answered: int = 0  # batches of the execute-batch answers since its last sent-update
    last_kind: str | None = None  # the kind of the last answer it got


class Noted:
    """A job's way to the coordinator whose answers come `delay_s` late, noting each."""

    def __init__(
        self, backend: JobBackend, coordinator: ActionCoordinator, tally: Tally, delay_s: float
    ):
        self._backend, self._coordinator = backend, coordinator
        self._tally, self._delay_s = tally, delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        details = request["status"]["details"]
        state, tally = details["state"], self._tally
        if tally.first_at is None:
            tally.first_at = time.monotonic()
        if state == "batch-completed":
            # Absent (upstream's executor): one batch, as the scheduler counts it.
            tally.counted += details["batch_size"] * details.get("batches", 1)
        elif state == "sent-update":
            scheduler_round = self._coordinator.actions.round
            own = int(details["round"]) - int(tally.upstream)  # upstream's counts from 1
            tally.sends.append((time.monotonic(), scheduler_round, own))
            tally.trained += int(details["metrics"].get("batches", tally.answered)) * BATCH_SIZE
            tally.answered = 0
            tally.applied_after_last_send = False
        elif state == "applied-update":
            # Upstream's repeats one after an execute-batch{0}: only an apply-update's counts.
            tally.applied_after_last_send |= not tally.upstream or tally.last_kind == "apply-update"
        time.sleep(self._delay_s)
        answer = self._backend.action(request)
        # {"executor": "train", "action": {"kind", ...}}: the action is one level down (reading
        # `kind` off "next" itself, as before, found no execute-batch{0} however many came).
        next_action = answer["next"]["action"]
        tally.last_kind = next_action.get("kind")
        if tally.last_kind == "execute-batch":
            batches = next_action.get("batches", 1)
            tally.answered += batches
            tally.zero_answers += int(batches == 0)
        return answer


def one_run(
    catalog: Catalog,
    options: RunOptions,
    speculative: str,
    delays_ms: tuple[int, int],
    base: Path,
    upstream: Path | None = None,
) -> dict[str, Any]:
    """`speculative` is this executor's setting, or UPSTREAM with `upstream`, the Python that
    runs upstream's executor."""
    tallies = {name: Tally(upstream=upstream is not None) for name in ("w1", "w2")}
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    env = {"OMP_NUM_THREADS": threads, "HYPHA_SPECULATIVE_STEP": speculative}
    entry = upstream_entry(upstream) if upstream else preset("process")
    started = time.monotonic()
    with build_coordinator(catalog, options) as coordinator:
        assert isinstance(coordinator, ActionCoordinator)  # the bench plays the action protocol
        client = CoordinatorClient(coordinator.url)
        codes: dict[str, int] = {}

        def run(name: str, delay_ms: int) -> None:
            worker = LocalWorker(name, entry, base, env=env)
            tally = tallies[name]
            backend = lambda job_id: Noted(  # noqa: E731
                client.backend(job_id), coordinator, tally, delay_ms / 1e3
            )
            codes[name] = serve_one_job(client, worker, backend)

        running = [
            threading.Thread(target=run, args=(name, delay), daemon=True)
            for name, delay in zip(tallies, delays_ms, strict=True)
        ]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(900)
        rounds = coordinator.actions.round
    sends = sorted(t for tally in tallies.values() for t in tally.sends)
    ends = [max(t for t, r, _ in sends if r == index) for index in range(rounds) if sends]
    begun = min((t.first_at for t in tallies.values() if t.first_at), default=started)
    durations = [b - a for a, b in zip([begun, *ends], ends, strict=False)]
    wall = (ends[-1] if ends else time.monotonic()) - begun
    trained = sum(t.trained for t in tallies.values())
    return {
        "codes": codes,
        "rounds": rounds,
        "durations": [round(d, 1) for d in durations],
        "applied": {
            name: (t.sends[-1][2] if t.sends else 0) + int(t.applied_after_last_send)
            for name, t in tallies.items()
        },
        "missed": sum(r - own for t in tallies.values() for _, r, own in t.sends),
        "zeros": sum(t.zero_answers for t in tallies.values()),
        "counted": sum(t.counted for t in tallies.values()),
        "trained": trained,
        "samples_per_s": trained / wall,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps-per-round", type=int, default=75, help="batches a worker")
    parser.add_argument("--delays", default="0,50", help="answer delays in ms (default 0,50)")
    parser.add_argument("--smoke", action="store_true", help="1 round of 4 steps, at once only")
    parser.add_argument(
        "--upstream",
        type=Path,
        metavar="PYTHON",
        help="also run both workers on upstream's executor, installed for this Python "
        "(bench/install_upstream_executor.sh)",
    )
    parser.add_argument(
        "--upstream-only", action="store_true", help="with --upstream: only upstream's rows"
    )
    arguments = parser.parse_args(argv)
    if arguments.upstream_only and not arguments.upstream:
        parser.error("--upstream-only needs --upstream")
    settings = [] if arguments.upstream_only else list(SPECULATIVE)
    settings += [UPSTREAM] if arguments.upstream else []
    rounds, steps = arguments.rounds, arguments.steps_per_round
    delays = [int(value) for value in arguments.delays.split(",")]
    if arguments.smoke:
        rounds, steps, delays = 1, 4, [0]
    options = RunOptions(
        workers=2, rounds=rounds, steps_per_round=steps, batch_size=BATCH_SIZE,
        generation="actions", broadcast_over="delivered",
    )  # fmt: skip
    # Upstream's executor saves its model with safetensors' save_model, which keeps one of
    # two tied tensors, so it cannot apply an update to the demo GPT-2 (tied embeddings):
    # with --upstream every row runs bench/rounds.py's demo, untied and without dropout.
    spec = MODELS["demo"] if arguments.upstream else options.asset_spec()
    catalog = Catalog.from_assets(ensure_assets(spec=spec))
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="hy-", dir="/tmp") as base,  # short socket paths
        contextlib.redirect_stdout(sys.stderr),  # the stand-in's own lines
    ):
        for delay in delays:
            for speeds in ("equal", "unequal"):
                pair = (delay, delay + (SLOWER_MS if speeds == "unequal" else 0))
                for speculative in settings:
                    work = Path(base) / f"{delay}-{speeds}-{speculative}"
                    work.mkdir()
                    python = arguments.upstream if speculative == UPSTREAM else None
                    result = one_run(catalog, options, speculative, pair, work, python)
                    rows.append((delay, speeds, speculative, result))
                    print(f"{delay} ms, {speeds}, speculative {speculative}: done", file=sys.stderr)
    print(
        f"upstream rounds: 2 workers x {rounds} rounds of {options.target_samples} samples, "
        f"GPT-2 demo{' (untied, no dropout)' if arguments.upstream else ''}, batch {BATCH_SIZE}, "
        "the stand-in in upstream's order"
    )
    print(
        "| answers | speeds | speculative | exit | rounds' durations (s) | applied w1/w2 | "
        "missed | execute-batch{0} | counted / trained | samples/s | vs off |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    baseline: dict[tuple[int, str], float] = {}
    for delay, speeds, speculative, r in rows:
        if speculative == "off":
            baseline[(delay, speeds)] = r["samples_per_s"]
        # Against this executor's off run of the same row, where it ran.
        off = baseline.get((delay, speeds))
        ratio = f"{r['samples_per_s'] / off:.2f}" if off else "-"
        exits = "/".join(str(code) for code in r["codes"].values())
        durations = ", ".join(f"{d:.1f}" for d in r["durations"])
        applied = "/".join(f"{n} of {r['rounds']}" for n in r["applied"].values())
        print(
            f"| {delay} ms | {speeds} | {speculative} | {exits} | {durations} | {applied} | "
            f"{r['missed']} | {r['zeros']} | {r['counted']} / {r['trained']} | "
            f"{r['samples_per_s']:.1f} | {ratio} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
