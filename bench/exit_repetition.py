"""How a finished multi-rank job leaves, counted over many runs.

    python bench/exit_repetition.py [--runs N] [--paths native,image,fsdp2,zero2] [--out DIR]
    python bench/exit_repetition.py --runs N --paths race,race-teardown

A job that trained, was told Done and printed its last round must exit 0 on every rank, every
time: a rank that aborts in the interpreter's teardown makes `accelerate launch` exit 1, and a
Hypha worker reports a finished job as failed. That abort came once in dozens of runs, so no
single test run shows it; this runs the same short job many times over and counts.

Each run is a 2-round job (2 batches a round) of the local stand-in, as one local worker runs
it, in a child process of its own whose stdout and stderr (every rank's) are read whole:

  native  the image's launcher on this machine: accelerate-configs/multi-cpu.yaml, 2 processes
  image   the same through the shim in the cpu image (`hypha-accelerate run --variant cpu`)
  fsdp2   accelerate launch with the shipped fsdp config (FSDP2) over 2 gloo processes, through
          tests/sharding/executor_on_cpu_as_on_gpus.py, which lifts accelerate's GPU-only gate
  zero2   the launcher with the shipped deepspeed-zero2 config, 2 processes (gloo on the CPU)

and, named only on request, the cause made to show in a few runs (bench/exit_race.py says how):

  race           2 gloo ranks whose teardown race is held open by a sort, leaving as the
                 executor does (entry.exit_without_teardown)
  race-teardown  the same leaving through the interpreter's teardown: a control, which aborts

Per path: runs, runs that finished (rank 0 printed the last round's `done`), non-zero exits,
abort lines (`terminate called`, a rank's `exitcode: -N`, `Aborted`, `core dumped`, `Fatal
Python error`) and runs that hung past --timeout. The whole output of every run that was not
clean is kept in --out, with results.json. Exit status 0 when every run was clean.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry, preset

REPO = Path(__file__).resolve().parents[1]
PATHS = ("native", "image", "fsdp2", "zero2")
# bench/exit_race.py under torchrun, the race's window held open: leaving as the executor does
# (race), and with the interpreter's teardown (race-teardown, which is expected to abort).
RACE_PATHS = {"race": "product", "race-teardown": "teardown"}
RACE_SCRIPT = REPO / "bench" / "exit_race.py"
ROUNDS = 2
STEPS_PER_ROUND = 2
# What a rank that died on a signal leaves in the output: the C++ runtime's last words before
# abort(), torch elastic's report of a rank's negative exit code (`exitcode: -6` in its log
# line, `exitcode  : -6` in its summary), the shell's and Python's own.
ABORT_LINE = re.compile(
    r"terminate called|exitcode\s*:\s*-\d|Aborted|core dumped|Fatal Python error"
)
# The child's last line: the executor's exit code, as the local worker got it.
EXIT_LINE = "exit-repetition: executor exit code "
# The worker's uid in the image path, as the image tests run it: not root, not this user.
CONTAINER_OWNER = (4321, 4321)
WORKER = "w1"


@dataclass
class Tally:
    path: str
    runs: int = 0
    finished: int = 0
    nonzero_exits: int = 0
    abort_lines: int = 0
    runs_with_abort_lines: int = 0
    hung: int = 0
    exit_codes: dict[str, int] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (
            self.finished == self.runs
            and self.nonzero_exits == 0
            and self.abort_lines == 0
            and self.hung == 0
        )


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None: no exit code reached the worker (hung, or the harness broke)
    finished: bool
    abort_lines: list[str]
    hung: bool
    seconds: float
    output: str

    @property
    def clean(self) -> bool:
        return self.exit_code == 0 and self.finished and not self.abort_lines and not self.hung


def abort_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if ABORT_LINE.search(line)]


def finished(path: str, output: str) -> bool:
    """Whether the job ran to its end: the scheduler's Done reached the last round."""
    if path in RACE_PATHS:
        return all(f"exit-race: rank {rank} done" in output for rank in (0, 1))
    return f"[{WORKER}] round {ROUNDS}: done" in output


def run_once(path: str, assets: Path | None, timeout_s: float) -> RunResult:
    """One whole job in a child process (this script with --one), its output read whole."""
    started = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--one", path]
    if assets is not None:
        command += ["--assets", str(assets)]
    try:
        child = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            cwd=REPO,
        )
        output, hung = child.stdout.decode("utf-8", "replace"), False
    except subprocess.TimeoutExpired as exc:
        # subprocess.run killed the child; the executor's own processes are the worker's to
        # end, and a hang is what this run reports.
        output, hung = (exc.stdout or b"").decode("utf-8", "replace"), True
    exit_code = None
    for line in output.splitlines():
        if line.startswith(EXIT_LINE):
            exit_code = int(line.removeprefix(EXIT_LINE))
    return RunResult(
        exit_code=exit_code,
        finished=finished(path, output),
        abort_lines=abort_lines(output),
        hung=hung,
        seconds=time.perf_counter() - started,
        output=output,
    )


def executor_entry(path: str, folder: Path) -> tuple[ExecutorEntry, tuple[int, int] | None]:
    """The worker's executor entry for `path`, and the work dir's owner it needs."""
    from hypha.accelerate_executor.platform.launcher.plan import free_port

    def launcher(config: str) -> ExecutorEntry:
        return ExecutorEntry(
            sys.executable,
            ("-m", "hypha.accelerate_executor.platform.launcher", "--accelerate-config", config,
             "--num-processes", "2", *EXECUTOR_ARGS),
        )  # fmt: skip

    if path == "native":
        return launcher("multi-cpu"), None
    if path == "zero2":
        return launcher("deepspeed-zero2"), None
    if path == "image":
        shim = preset("shim:cpu")
        args = (*shim.args, "--accelerate-config", "multi-cpu", "--num-processes", "2")
        return ExecutorEntry(shim.cmd, args, shim.env), CONTAINER_OWNER
    if path == "fsdp2":
        # The processes join over gloo, as accelerate's CPU path has them; fp32, since FSDP's
        # bf16 on the CPU adds minutes and nothing to how a rank leaves.
        text = (REPO / "accelerate-configs" / "fsdp.yaml").read_text()
        text = text.replace("use_cpu: false", "use_cpu: true")
        config = folder / "fsdp.yaml"
        config.write_text(text.replace("mixed_precision: bf16", "mixed_precision: 'no'"))
        script = REPO / "tests" / "sharding" / "executor_on_cpu_as_on_gpus.py"
        entry = ExecutorEntry(
            sys.executable,
            ("-m", "accelerate.commands.launch", "--config_file", str(config),
             "--num_processes", "2", "--main_process_port", str(free_port()), str(script),
             *EXECUTOR_ARGS),
            (("ACCELERATE_USE_CPU", "True"),),
        )  # fmt: skip
        return entry, None
    raise ValueError(f"unknown path {path!r}")


def race(how: str) -> int:
    """The child of the race paths: bench/exit_race.py over 2 ranks; prints torchrun's exit code."""
    # --standalone: the rendezvous store binds a port of its own choosing, where a port picked
    # free beforehand could be taken by another process before torchrun binds it.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(RACE_SCRIPT), how]  # fmt: skip
    code = subprocess.run(command, stdin=subprocess.DEVNULL, cwd=REPO).returncode
    print(f"{EXIT_LINE}{code}", flush=True)
    return 0


def one_job(path: str, assets: Path | None) -> int:
    """The child: one job of the local stand-in as worker w1; prints the executor's exit code."""
    if path in RACE_PATHS:
        return race(RACE_PATHS[path])
    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    options = RunOptions(
        workers=1, rounds=ROUNDS, steps_per_round=STEPS_PER_ROUND, generation="alpha17"
    )
    coordinator = build_coordinator(Catalog.from_assets(ensure_assets(assets)), options)
    coordinator.start()
    # Short (a socket path must fit 107 bytes) and traversable by the container's uid.
    with tempfile.TemporaryDirectory(prefix="hy-exit-", dir="/tmp") as folder:
        work_base = Path(folder)
        entry, owner = executor_entry(path, work_base)
        if owner is not None:
            work_base.chmod(0o755)
        try:
            worker = LocalWorker(WORKER, entry, work_base, owner=owner)
            code = serve_one_job(CoordinatorClient(coordinator.url), worker)
        finally:
            coordinator.stop()
    print(f"{EXIT_LINE}{code}", flush=True)
    return 0


def measure(
    paths: Sequence[str], runs: int, out: Path, timeout_s: float, assets: Path | None
) -> dict[str, Tally]:
    """`runs` jobs per path, the paths taking turns so that a busy spell of the machine falls
    on all of them."""
    tallies = {path: Tally(path) for path in paths}
    for number in range(1, runs + 1):
        for path in paths:
            result = run_once(path, assets, timeout_s)
            tally = tallies[path]
            tally.runs += 1
            tally.finished += result.finished
            tally.nonzero_exits += result.exit_code != 0 and not result.hung
            tally.abort_lines += len(result.abort_lines)
            tally.runs_with_abort_lines += bool(result.abort_lines)
            tally.hung += result.hung
            code = "hung" if result.hung else str(result.exit_code)
            tally.exit_codes[code] = tally.exit_codes.get(code, 0) + 1
            tally.seconds.append(round(result.seconds, 1))
            verdict = "clean" if result.clean else "NOT CLEAN"
            if not result.clean:
                log = out / f"{path}-{number}.log"
                log.write_text(result.output, encoding="utf-8")
                verdict += f" (exit {code}, {len(result.abort_lines)} abort lines; {log})"
            print(f"{path} run {number}/{runs}: {verdict}, {result.seconds:.0f} s", file=sys.stderr)
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    header = ("path", "runs", "finished", "non-zero exits", "abort lines", "runs w/ aborts", "hung")
    rows = [header] + [
        (t.path, str(t.runs), str(t.finished), str(t.nonzero_exits), str(t.abort_lines),
         str(t.runs_with_abort_lines), str(t.hung))
        for t in tallies.values()
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def paths_argument(value: str) -> list[str]:
    paths = [p for p in value.split(",") if p]
    choices = (*PATHS, *RACE_PATHS)
    unknown = sorted(set(paths) - set(choices))
    if unknown or not paths:
        raise argparse.ArgumentTypeError(
            f"paths are a comma-separated choice of {','.join(choices)}"
        )
    return paths


def positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive, default=20, help="jobs per path (default 20)")
    parser.add_argument(
        "--paths", type=paths_argument, default=list(PATHS), help=f"default {','.join(PATHS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "exit-repetition",
        help="results.json and the output of every run that was not clean",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a run counts as hung"
    )
    parser.add_argument(
        "--assets", type=Path, help="the stand-in's model and data cache (default: its own)"
    )
    parser.add_argument(
        "--one", choices=(*PATHS, *RACE_PATHS), help=argparse.SUPPRESS
    )  # the child's mode
    arguments = parser.parse_args(argv)
    if arguments.one:
        return one_job(arguments.one, arguments.assets)

    out: Path = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    from hypha.standin.data_service.assets import ensure_assets

    ensure_assets(arguments.assets)  # once, before the first run's clock starts
    tallies = measure(arguments.paths, arguments.runs, out, arguments.timeout, arguments.assets)
    results = {
        "runs_per_path": arguments.runs,
        "rounds": ROUNDS,
        "steps_per_round": STEPS_PER_ROUND,
        "commit": _commit(),
        "paths": {path: asdict(tally) for path, tally in tallies.items()},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(table(tallies))
    return 0 if all(t.clean for t in tallies.values()) else 1


def _commit() -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=REPO
    )
    return done.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
