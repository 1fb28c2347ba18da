"""The launcher's command line: the plan, the checks, then the ranks run to their end."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.entry import (
    RANK_EXITS_ENV,
    OneLineArgumentParser,
    ranks_exit,
    run_main,
)
from hypha.accelerate_executor.errors import EXIT_OK, LaunchError
from hypha.accelerate_executor.platform.gpus import dev_dir
from hypha.accelerate_executor.platform.launcher.discovery import (
    gpu_image_without_gpus,
    image_variant,
)
from hypha.accelerate_executor.platform.launcher.plan import describe, plan
from hypha.accelerate_executor.platform.launcher.preflight import (
    check_driver,
    require_usable_gpus,
    require_writable_home,
)
from hypha.accelerate_executor.platform.variants import BY_NAME
from hypha.accelerate_executor.supervisor import Interrupts, Supervisor

PROG = "launcher"  # what its lines start with


def run_ranks(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs the ranks to their end; 128 + the signal when SIGTERM, SIGINT or SIGHUP ended them,
    else the exit code the failed ranks chose (torchrun exits 1 whatever theirs were: a job
    refused in one line exits 2, as with one process)."""
    interrupts = Interrupts((signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    with tempfile.TemporaryDirectory(prefix="hypha-rank-exits-") as exits:
        code = Supervisor(interrupts).run(command, {**env, RANK_EXITS_ENV: exits})
        if interrupts.signum is not None:
            return interrupts.exit_code
        said = ranks_exit(exits) if code else None
    if said is None:
        return code
    rank_code, line = said
    if line:  # the job's one line, last, after torchrun's summary of the failure
        print(line, file=sys.stderr, flush=True)
    return rank_code


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="python -m hypha.accelerate_executor.platform.launcher",
        description="Choose an accelerate config and start the Hypha training executor's ranks.",
    )
    p.add_argument("--socket", help="the job bridge's Unix socket (WORK_DIR/bridge.sock)")
    p.add_argument("--work-dir", help="the job's work directory")
    p.add_argument(
        "--job", help="the job spec JSON, or @PATH to a file holding it; default: $JOB_JSON"
    )
    p.add_argument(
        "--accelerate-config",
        default="auto",
        metavar="auto|NAME|PATH",
        help="auto (from the variant and visible GPUs), a bundled config's name "
        "(cpu, multi-cpu, gpu, multi-gpu, fsdp, deepspeed-zero2, deepspeed-zero3, mps) "
        "or a path to a YAML file; default auto",
    )
    p.add_argument(
        "--num-processes",
        type=int,
        metavar="N",
        help="training processes; default: one per visible GPU",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the chosen config and command, run nothing",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
        if args.version:
            print(f"hypha-accelerate-executor {__version__} ({image_variant(os.environ)})")
            return EXIT_OK
        if args.num_processes is not None and args.num_processes < 1:
            raise LaunchError(f"--num-processes must be at least 1, not {args.num_processes}")
        if not args.print_config:
            given = {**vars(args), "job": args.job or os.environ.get("JOB_JSON")}
            missing = [
                f"--{n.replace('_', '-')}" for n in ("socket", "work_dir", "job") if not given[n]
            ]
            if missing:
                raise LaunchError(f"missing {', '.join(missing)} (see --help)")
        dev = dev_dir(os.environ)
        chosen = plan(args, os.environ, dev)
        accelerator = BY_NAME[chosen.variant].accelerator
        # Outside an image (no HYPHA_VARIANT) the torch installed is not the table's.
        if chosen.gpus and accelerator == "nvidia" and "HYPHA_VARIANT" in os.environ:
            print(
                f"{PROG}: {check_driver(chosen.variant, chosen.gpus, os.environ, dev)}", flush=True
            )
        if not args.print_config:
            require_writable_home(os.environ)
            if chosen.gpus and accelerator in ("nvidia", "rocm"):
                require_usable_gpus(chosen.variant, chosen.gpus, os.environ)
        if args.print_config:
            print(describe(chosen))
            return EXIT_OK
        if args.accelerate_config == "auto" and gpu_image_without_gpus(chosen.variant, chosen.gpus):
            print(f"{PROG}: warning: {chosen.how_chosen.removeprefix('auto: ')}", flush=True)
        return run_ranks(chosen.command, {**os.environ, **chosen.env})

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
