"""The executor: one Hypha DiLoCo training job, top to bottom.

    python -m hypha.accelerate_executor.training --socket S --work-dir W --job J

J is the job JSON, or @path to a file holding it. Run it plainly for one process, or
under `accelerate launch` for several; only rank 0 talks to the bridge. Exit codes:
0 the scheduler said Done (alpha.17) or terminate (actions), 1 the job failed, 2 the job
spec or arguments are bad, 143 cancelled by SIGTERM.

Which bridge generation drives the job (`--bridge-generation`, HYPHA_BRIDGE_GENERATION):
`auto` (the default) reads it off the job, and asks the bridge where the job fits both
(protocol/generation.py, `bridge_generation`); the first line says which it is and why. Each generation's loop is in
its folder: alpha17/loop.py, actions/loop.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path
from types import FrameType

from hypha.accelerate_executor import telemetry
from hypha.accelerate_executor.bridge.client import probe_generation
from hypha.accelerate_executor.entry import (
    OneLineArgumentParser,
    exit_without_teardown,
    run_main,
)
from hypha.accelerate_executor.errors import EXIT_OK, Cancelled, JobSpecError, UsageError
from hypha.accelerate_executor.protocol.actions.job import ActionJob
from hypha.accelerate_executor.protocol.generation import bridge_generation
from hypha.accelerate_executor.protocol.job import job_bytes
from hypha.accelerate_executor.training import settings
from hypha.accelerate_executor.training.settings import RunSettings
from hypha.accelerate_executor.training.workbench import say

# The module a worker runs (`python -m ...`), and what this process's own lines start with.
PROG = "hypha.accelerate_executor.training"
# Unless set: what each generation's own executors send, since a parameter server adds only
# tensors of the same name, shape and dtype (upstream's `apply_tensor_op`), and a pool mixing
# dtypes aggregates nothing. The action protocol's accelerate executor casts its
# pseudo-gradients to bfloat16 (`extract_gradients` in its utils.py, hypha-space/hypha
# executors/accelerate/.../utils.py, index id 66915679428, commit 012f80dd); alpha.17's sends
# float32 (docs/protocol.md).
PSEUDO_GRADIENT_DTYPE_BY_GENERATION = {"actions": "bfloat16", "alpha17": "float32"}


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    """The arguments, and every setting (settings.SETTINGS) from its flag or `HYPHA_*`
    variable: a value a setting refuses ends here, before the bridge is touched."""
    parser = OneLineArgumentParser(
        prog=f"python -m {PROG}",
        description="Run one Hypha DiLoCo training job over the Job Bridge.",
    )
    parser.add_argument("--socket", required=True, type=Path, help="the Job Bridge's Unix socket")
    parser.add_argument("--work-dir", required=True, type=Path, help="the job's work dir")
    parser.add_argument(
        "--job",
        default=os.environ.get("JOB_JSON"),
        help="the job JSON, or @path to a file holding it; default: $JOB_JSON, which the "
        "Hypha worker sets, and which keeps a token out of the process list",
    )
    settings.add_flags(parser)
    arguments = parser.parse_args(argv)
    if arguments.job is None:
        raise UsageError("the job is missing: give --job, or set JOB_JSON")
    return arguments


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Cancelled()


def _unexpected(exc: Exception) -> str:
    """A bug, or torch/transformers refusing the model: one line, still."""
    if os.environ.get("HYPHA_DEBUG"):
        traceback.print_exc()
    return f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"


def main(argv: list[str] | None = None) -> int:
    from hypha.accelerate_executor.training.actions.loop import ActionTrainer
    from hypha.accelerate_executor.training.alpha17.loop import Trainer

    signal.signal(signal.SIGTERM, _on_sigterm)
    # DeepSpeed calls collectives that torch has deprecated, and the warning repeats every step.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")

    def body() -> int:
        arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
        job, generation, why = bridge_generation(
            job_bytes(arguments.job),
            arguments.bridge_generation,
            lambda: probe_generation(arguments.socket),
        )
        telemetry.start(job.job_id)
        if not arguments.work_dir.is_dir():
            raise JobSpecError(f"work dir {arguments.work_dir} does not exist")
        if os.environ.get("RANK", "0") == "0":
            say(f"{PROG}: bridge generation {generation} ({why})")
        run = RunSettings(
            socket_path=arguments.socket,
            work_dir=arguments.work_dir,
            pseudo_gradient_dtype=(
                arguments.pseudo_gradient_dtype or PSEUDO_GRADIENT_DTYPE_BY_GENERATION[generation]
            ),
            micro_batch_size=arguments.micro_batch_size,
            trust_remote_code=arguments.trust_remote_code,
            compile=arguments.compile,
            speculative_step=arguments.speculative_step,
            model_dir=arguments.model_dir,
            gradient_checkpointing=arguments.gradient_checkpointing,
        )
        if isinstance(job, ActionJob):
            ActionTrainer(job, run).run()
        else:
            Trainer(job, run).run()
        return EXIT_OK

    return run_main(PROG, body, _unexpected)


if __name__ == "__main__":
    exit_without_teardown(main())
