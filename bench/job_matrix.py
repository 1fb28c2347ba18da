"""Runs bridge generation x job x launch through the local stand-in and prints a table: each
cell's exit codes, rounds reported and the mean loss of the first and last round.

    python bench/job_matrix.py [--ranks native shim 2-ranks] [--generations actions alpha17]
                               [--jobs lenet causal-lm resnet t5 masked-lm] [--rounds 3]

Jobs: `lenet` (the shape of the job Hypha's scheduler sends by default), `causal-lm` (the
stand-in's tiny GPT-2) and `masked-lm` (its tiny BERT) are the stand-in's own jobs, at
`--rounds` rounds and their own round length; `resnet` (ResNet with BatchNorm, image
classification) and `t5` (text to text) are the task matrix's tiny models and slices
(tests/helpers/task_models.py), in the stand-in's job with their task and inputs. Launches: `native`
runs `python -m hypha.accelerate_executor.training`; `shim` runs `hypha-accelerate run
--variant cpu`, the executor in the cpu image (`HYPHA_ACCELERATE_IMAGE` names another tag);
`2-ranks` runs the launcher with the `multi-cpu` accelerate config over 2 processes (gloo).
One worker per cell, its executor on all of this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.coordinator.report import round_losses
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import ensure_assets
from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry, preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

REPO = Path(__file__).resolve().parents[1]
STAND_IN_JOBS = {"lenet": "lenet", "causal-lm": "causal-lm", "masked-lm": "bert-mlm"}
TASK_JOBS = {"resnet": "image-classification", "t5": "seq2-seq-lm"}
JOBS = [*STAND_IN_JOBS, *TASK_JOBS]
RANKS = ["native", "shim", "2-ranks"]
CELL_TIMEOUT_S = 900.0


def executor(ranks: str, trust_remote_code: bool) -> ExecutorEntry:
    if ranks in ("native", "shim"):
        return preset(
            "process" if ranks == "native" else "shim", trust_remote_code=trust_remote_code
        )
    args = ("--accelerate-config", "multi-cpu", "--num-processes", "2", *EXECUTOR_ARGS)
    env = (("HYPHA_TRUST_REMOTE_CODE", "1"),) if trust_remote_code else ()
    return ExecutorEntry(
        sys.executable, ("-m", "hypha.accelerate_executor.platform.launcher", *args), env
    )


class TaskClient(CoordinatorClient):
    """The coordinator's client, with the job made a task matrix case's (its task, inputs
    and learning rate)."""

    def __init__(self, url: str, case: Any) -> None:
        super().__init__(url)
        self.case = case

    def request_job(self, worker: str) -> str:
        job: dict[str, Any] = json.loads(super().request_job(worker))
        self.case.retarget(job)
        return json.dumps(job)


@dataclass
class Cell:
    generation: str
    job: str
    ranks: str
    exit_codes: list[int | None]
    rounds: int
    first: float | None
    last: float | None
    seconds: float


def task_case(job: str) -> Any:
    """The task matrix's case (tests/helpers/task_models.py) for a task job: its tiny model and
    slices."""
    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from task_models import CASES

    return next(case for case in CASES if case.task == TASK_JOBS[job])


def run_cell(generation: str, job: str, ranks: str, rounds: int, root: Path) -> Cell:
    started = time.perf_counter()
    case: Any = None
    if job in TASK_JOBS:
        case = task_case(job)
        catalog = case.write_catalog(root / "assets")
        options = RunOptions(
            workers=1, rounds=rounds, steps_per_round=6, batch_size=8, learning_rate=1e-2,
            lr_schedule="constant", outer_momentum=0.5, generation=generation,  # type: ignore[arg-type]
        )  # fmt: skip
    else:
        options = RunOptions.for_job(
            STAND_IN_JOBS[job],  # type: ignore[arg-type]
            workers=1,
            rounds=rounds,
            generation=generation,
        )
        catalog = Catalog.from_assets(ensure_assets(root / "assets", options.asset_spec()))
    codes: list[int | None] = [None]
    with build_coordinator(catalog, options) as coordinator:
        client = TaskClient(coordinator.url, case) if case else CoordinatorClient(coordinator.url)
        worker = LocalWorker("w1", executor(ranks, job == "lenet"), root / "work")

        def run() -> None:
            codes[0] = serve_one_job(client, worker)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(CELL_TIMEOUT_S)
        if thread.is_alive():
            coordinator.cancel(f"the cell ran past {CELL_TIMEOUT_S:g} s")
            thread.join(30)
        summary = coordinator.summary()
    means = [
        sum(losses.values()) / len(losses) for _, losses in sorted(round_losses(summary).items())
    ]
    return Cell(
        generation,
        job,
        ranks,
        codes,
        len(means),
        means[0] if means else None,
        means[-1] if means else None,
        time.perf_counter() - started,
    )


def table(cells: list[Cell]) -> str:
    lines = [
        "| generation | job | launch | exit | rounds | loss first -> last | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        loss = "-"
        if c.first is not None and c.last is not None:
            loss = f"{c.first:.3f} -> {c.last:.3f} (x{c.last / c.first:.2f})"
        exits = ", ".join("-" if code is None else str(code) for code in c.exit_codes)
        lines.append(
            f"| {c.generation} | {c.job} | {c.ranks} | {exits} | {c.rounds} | {loss} | {c.seconds:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--generations", nargs="+", choices=["actions", "alpha17"], default=["actions", "alpha17"]
    )
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=JOBS)
    parser.add_argument("--ranks", nargs="+", choices=RANKS, default=RANKS)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    cells = []
    for ranks in args.ranks:
        for job in args.jobs:
            for generation in args.generations:
                with tempfile.TemporaryDirectory(prefix="jm-", dir="/tmp") as root:
                    (Path(root) / "work").mkdir()
                    cell = run_cell(generation, job, ranks, args.rounds, Path(root))
                cells.append(cell)
                print(table([cell]).splitlines()[-1], flush=True)
    print()
    print(table(cells))
    return 0 if all(code == 0 for c in cells for code in c.exit_codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
