"""`hypha-accelerate local demo|coordinator|worker`.

`demo` runs everything in one process; `coordinator` and `worker` are the same parts as
separate processes (one per container in compose). Each command imports only what it
needs: `worker` stays torch-free.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_FAILED, EXIT_OK, UsageError
from hypha.accelerate_executor.protocol.generation import GENERATIONS
from hypha.standin.console import say
from hypha.standin.errors import LocalError
from hypha.standin.jobs import JOB_KINDS, LR_SCHEDULES, LrSchedule
from hypha.standin.worker.faults import Fault, parse_fault

PROG = "hypha-accelerate local"


def _owner(text: str) -> tuple[int, int]:
    try:
        uid, gid = text.split(":")
        return int(uid), int(gid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected UID:GID, got {text!r}") from None


def _count_or_unset(text: str) -> int | None:
    """An integer, or None for an empty value (compose passes unset variables as empty)."""
    try:
        return int(text) if text else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _schedule_or_unset(text: str) -> LrSchedule | None:
    """A learning-rate schedule, or None for an empty value (as `_count_or_unset`)."""
    if not text:
        return None
    if text not in LR_SCHEDULES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LR_SCHEDULES)}, got {text!r}")
    return text


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}") from None


def _run_options_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(add_help=False)
    run = parser.add_argument_group("run (unset options take the job's defaults)")
    run.add_argument(
        "--job",
        choices=JOB_KINDS,
        default="causal-lm",
        help="causal-lm (tiny GPT-2, default), llama (the same with a tiny Llama, which tensor "
        "parallelism can split), lenet (the default Hypha job's shape: LeNet as "
        "remote code, an image processor, 1000-sample slices, batch 600) or bert-mlm",
    )
    run.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    run.add_argument(
        "--generation",
        choices=GENERATIONS,
        default=os.environ.get("HYPHA_LOCAL_GENERATION") or "actions",
        help="the Hypha side to play: actions (the action protocol of the releases after "
        "v1.0.0-alpha.17, default) or alpha17 (the statuses of v1.0.0-alpha.17 and earlier); "
        "the workers follow the coordinator's jobs (default: $HYPHA_LOCAL_GENERATION)",
    )
    run.add_argument(
        "--late-workers",
        type=int,
        default=0,
        help="actions only: this many more workers, whose jobs begin after round 1 and who "
        "get the model from a peer (default 0)",
    )
    run.add_argument(
        "--scheduler-clock-skew",
        type=float,
        metavar="SECONDS",
        help="actions only: the scheduler's clock this many seconds ahead of the workers' "
        "(negative: behind), every deadline it sends shifted by it (default 0)",
    )
    run.add_argument("--rounds", type=_count_or_unset, help="DiLoCo rounds (causal-lm 4, lenet 10)")
    run.add_argument(
        "--steps-per-round",
        type=_count_or_unset,
        help="the round's sample target in batches per worker (causal-lm 30, lenet 8)",
    )
    run.add_argument(
        "--samples-per-round",
        type=int,
        help="the round's sample target itself (upstream's avg_samples_between_updates); "
        "default: steps-per-round x batch-size x workers",
    )
    run.add_argument("--batch-size", type=int, help="each worker's batch (causal-lm 8, lenet 600)")
    run.add_argument("--lr", type=float, help="inner learning rate (causal-lm 2e-3, lenet 1e-3)")
    run.add_argument(
        "--lr-schedule",
        type=_schedule_or_unset,
        metavar="{" + ",".join(LR_SCHEDULES) + "}",
        help="the inner learning rate's schedule (default: the job's, cosine-with-warmup)",
    )
    run.add_argument("--warmup-steps", type=int)
    run.add_argument("--outer-lr", type=float, help="parameter server learning rate (0.7)")
    run.add_argument(
        "--outer-momentum",
        type=float,
        help="parameter server Nesterov momentum (0.9)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=Path("hypha-local-out"),
        help="where summary.json and loss.png go",
    )
    run.add_argument(
        "--assets", type=Path, default=None, help="cache folder of the generated model and data"
    )
    run.add_argument(
        "--timeout", type=float, default=1800.0, help="cancel the run after this many seconds"
    )
    return parser


def _worker_options_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(add_help=False)
    worker = parser.add_argument_group("worker")
    worker.add_argument(
        "--executor",
        action="append",
        default=[],
        help="process (python -m ...training), shim (hypha-accelerate run --variant cpu), "
        "shim:VARIANT or toml:PATH (the first train/process [[executors]] entry of a worker "
        "TOML: a command of your own); default process. The demo takes one per worker, in "
        "order, the last serving the rest (a mixed pool); a worker takes the last; empty "
        "values are ignored",
    )
    worker.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the executor run a model's own code (the demo sets it for --job lenet, "
        "whose model this project generates)",
    )
    worker.add_argument(
        "--work-base",
        type=Path,
        default=Path(tempfile.gettempdir()) / "hypha-work",
        help="parent of the per-job work dirs",
    )
    worker.add_argument(
        "--lenient-receive",
        action="store_true",
        help="actions only, kinder than upstream's worker: the bridge keeps a push that comes "
        "while no receive of the job is open for the next receive instead of refusing it, and "
        "lets receives open side by side",
    )
    worker.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="ROUTE=STATUS:ERROR[:TIMES]",
        help="the first worker's bridge answers ROUTE's first TIMES requests (1) of its job "
        "with this error, as a worker whose remote side is unreachable does; repeatable, e.g. "
        "/resources/send=500:connector_error:1; also ROUTE=kill, /resources/receive=busy[:TIMES], "
        "/resources/receive=slow:SECONDS[:TIMES], /resources/fetch=truncated[:TIMES], "
        "/resources/receive=cut[:TIMES], /action/update=scheduler-error[:AFTER] (docs/faults.md)",
    )
    worker.add_argument(
        "--as-user",
        type=_owner,
        default=None,
        metavar="UID:GID",
        help="as root: play a worker running as this user",
    )
    return parser


def _parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(
        prog=PROG,
        description="Local stand-in for the Hypha side of the executor contract.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_options, worker_options = _run_options_parser(), _worker_options_parser()
    commands.add_parser(
        "demo",
        parents=[run_options, worker_options],
        help="coordinator and workers in one process; exits 0 if the loss falls",
        description="Runs a coordinator and N workers in one process, prints each round's loss, writes "
        "loss.png and summary.json, exits 0 only if every executor exited 0 and the final mean loss is "
        "<= 0.6 x the first round's.",
    )
    coordinator = commands.add_parser(
        "coordinator", parents=[run_options], help="the coordinator alone, for separate workers"
    )
    coordinator.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 8000),
        metavar="HOST:PORT",
        help="default 127.0.0.1:8000",
    )
    worker = commands.add_parser(
        "worker", parents=[worker_options], help="one worker that runs one job of a coordinator"
    )
    worker.add_argument(
        "--coordinator", required=True, metavar="URL", help="e.g. http://coordinator:8000"
    )
    worker.add_argument(
        "--name",
        default=os.environ.get("HYPHA_WORKER_NAME"),
        required="HYPHA_WORKER_NAME" not in os.environ,
        help="this worker's name in the coordinator's report (default: $HYPHA_WORKER_NAME)",
    )
    worker.add_argument(
        "--keep-work-dir", action="store_true", help="leave the work dir for inspection"
    )
    worker.add_argument(
        "--connect-timeout", type=float, default=120.0, help="seconds to wait for the coordinator"
    )
    worker.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per executor (OMP_NUM_THREADS); set it when workers share a host",
    )
    worker.add_argument(
        "--linger",
        action="store_true",
        help="after the job, stay until stopped (SIGTERM or SIGINT), then exit with the job's "
        "code (compose: the first container to exit ends the run, and that must be the "
        "coordinator)",
    )
    return parser


def main(argv: list[str]) -> int:
    def body() -> int:
        args = _parser().parse_args(argv)
        if getattr(args, "as_user", None) is not None and os.geteuid() != 0:
            raise UsageError("--as-user needs root (it plays a worker running as that user)")
        if args.command == "worker":
            return run_main(f"{PROG} worker", lambda: _worker(args))
        try:
            return _with_run_options(args)
        except OSError as exc:
            # Cache, output or work folders that cannot be written.
            raise LocalError(str(exc)) from None

    return run_main(PROG, body)


def _push_destination() -> tuple[str, str] | None:
    """The job's model_destination, from HYPHA_PUSH_REPOSITORY and HYPHA_PUSH_TOKEN (never an
    argument: a command line is readable by every local user); None when neither is set."""
    repository = os.environ.get("HYPHA_PUSH_REPOSITORY") or None
    token = os.environ.get("HYPHA_PUSH_TOKEN") or None
    if repository is None and token is None:
        return None
    if repository is None or token is None:
        raise UsageError("a push destination needs both HYPHA_PUSH_REPOSITORY and HYPHA_PUSH_TOKEN")
    if repository.count("/") != 1 or not all(repository.split("/")):
        raise UsageError(f"HYPHA_PUSH_REPOSITORY {repository!r} is not OWNER/NAME")
    return repository, token


def _hub_standin() -> bool:
    choice = os.environ.get("HYPHA_PUSH_HUB", "")
    if choice not in ("", "standin"):
        raise UsageError(f"HYPHA_PUSH_HUB {choice!r}: only `standin` (or unset: HF_ENDPOINT's Hub)")
    return choice == "standin"


def _with_run_options(args: argparse.Namespace) -> int:
    from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator

    given = {
        "workers": args.workers,
        "rounds": args.rounds,
        "steps_per_round": args.steps_per_round,
        "samples_per_round": args.samples_per_round,
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "lr_schedule": args.lr_schedule,
        "warmup_steps": args.warmup_steps,
        "outer_learning_rate": args.outer_lr,
        "outer_momentum": args.outer_momentum,
        "generation": args.generation,
        "late_workers": args.late_workers,
        "scheduler_clock_skew_s": args.scheduler_clock_skew,
    }
    options = RunOptions.for_job(
        args.job, **{name: value for name, value in given.items() if value is not None}
    )
    if args.command == "demo":
        from hypha.standin.demo import run_demo
        from hypha.standin.worker.executor_entries import executor_entry

        trust = args.trust_remote_code or options.job == "lenet"
        executors = [
            executor_entry(spec, trust_remote_code=trust) for spec in _executor_specs(args)
        ]
        return run_demo(
            options,
            executors,
            out_dir=args.out,
            work_base=args.work_base,
            assets_dir=args.assets,
            owner=args.as_user,
            timeout_s=args.timeout,
            strict_receive=not args.lenient_receive,
            push_destination=_push_destination(),
            hub_standin=_hub_standin(),
            faults=tuple(args.fault),
        )

    from hypha.standin.coordinator.report import finish
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.demo import cancel_on_signals, supervise

    host, port = args.listen
    catalog = Catalog.from_assets(ensure_assets(args.assets, options.asset_spec()))
    try:
        coordinator = build_coordinator(
            catalog, options, host=host, port=port, push_destination=_push_destination()
        )
    except OSError as exc:
        raise LocalError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    with coordinator, cancel_on_signals(coordinator):
        say("coordinator", f"listening on {host}:{port}; waiting for {options.workers} workers")
        supervise(coordinator, coordinator.finished, args.timeout)
        passed = finish(coordinator.summary(), args.out, prefix="coordinator")
    return EXIT_OK if passed else EXIT_FAILED


def _executor_specs(args: argparse.Namespace) -> list[str]:
    """The --executor values given, empty ones left out (compose passes one for a worker
    whose own executor is not set), or the default."""
    return [spec for spec in args.executor if spec] or ["process"]


def _fault(text: str) -> Fault:
    try:
        return parse_fault(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _worker(args: argparse.Namespace) -> int:
    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.worker.executor_entries import executor_entry
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    worker = LocalWorker(
        args.name,
        executor_entry(
            os.environ.get("HYPHA_WORKER_EXECUTOR") or _executor_specs(args)[-1],
            trust_remote_code=args.trust_remote_code,
        ),
        args.work_base,
        owner=args.as_user,
        keep_work_dir=args.keep_work_dir,
        strict_receive=not args.lenient_receive,
        faults=tuple(args.fault),
        env={"OMP_NUM_THREADS": str(args.threads)} if args.threads else None,
    )
    client = CoordinatorClient(args.coordinator)
    client.wait_until_up(args.connect_timeout)

    def cancel(signum: int, frame: FrameType | None) -> None:
        say(args.name, f"{signal.Signals(signum).name}: cancelling the job")
        worker.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, cancel)
    exit_code = serve_one_job(client, worker)
    if args.linger:
        # Not "until the coordinator is gone": its process outlives its server by the
        # interpreter's teardown, which under QEMU took over 10 s, and a worker that left
        # first ended compose's run with the coordinator killed (137) instead of its verdict.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda signum, frame: sys.exit(exit_code))
        while True:
            signal.pause()
    return exit_code
