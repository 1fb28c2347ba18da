"""`hypha-accelerate selftest` (and `selftest` as an image's command): does this host train
with this executor, and how fast?

    hypha-accelerate selftest [--model auto|tiny|small|gpt2-124m] [--mixed-precision auto|no|bf16]
        [--accelerate-config auto|NAME|PATH] [--num-processes N] [--rounds N]
        [--compile auto|on|off] [--skip bare,oom,allreduce] [--peak-tflops X] [--json PATH]

One job from the local stand-in trains through the path a Hypha worker takes (the launcher,
the accelerate ranks, the bridge client over a real Unix socket) on every visible
accelerator; a bare loop of the same model and batch runs before and after it. The table on
stdout says what the host is, how fast each trained, their model FLOP utilisation, peak
memory, the all-reduce bandwidth between devices (when there are several) and whether a
batch that does not fit trains in halved micro-batches (on a GPU), then one verdict line;
exit 0 on PASS, 1 on FAIL. Progress and the executor's own lines go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import UsageError
from hypha.selftest.devices import Host, peak_tflops, probe_host
from hypha.selftest.report import Report, as_json, judge, render
from hypha.selftest.workload import SIZES, ModelSize
from hypha.standin.jobs import GENERATIONS

PROG = "selftest"
PARTS = ("bare", "oom", "allreduce")


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="hypha-accelerate selftest",
        description="Train a small job through the executor on this host's accelerators and "
        "print what it found: devices, speed against a bare loop, MFU, memory, a verdict.",
    )
    p.add_argument(
        "--model",
        choices=("auto", *SIZES),
        default="auto",
        help="the GPT-2 size to train (random weights, nothing downloaded); "
        "auto: gpt2-124m on a GPU, tiny on the CPU",
    )
    p.add_argument(
        "--mixed-precision",
        choices=("auto", "no", "bf16"),
        default="auto",
        help="auto: bf16 on GPUs that have it, no on the CPU",
    )
    p.add_argument(
        "--accelerate-config",
        default="auto",
        metavar="auto|NAME|PATH",
        help="auto (one process per GPU, or one on the CPU), a bundled config's name "
        "(fsdp, deepspeed-zero2, ...) or a YAML file; its mixed precision and process count "
        "are set from this command's",
    )
    p.add_argument("--num-processes", type=int, metavar="N", help="default: one per GPU")
    p.add_argument(
        "--bridge-generation",
        choices=GENERATIONS,
        default="alpha17",
        help="the Hypha side the stand-in plays: alpha.17's statuses or the action protocol "
        "of later workers (default alpha17)",
    )
    p.add_argument(
        "--speculative-step",
        choices=("auto", "on", "off"),
        default="auto",
        help="action protocol: the executor's speculative step (docs/protocol-actions.md; "
        "default auto)",
    )
    p.add_argument(
        "--answer-delay-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="hold back each of the stand-in scheduler's answers this long, as a remote "
        "scheduler's network hop would (the stand-in answers at once; default 0)",
    )
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="the executor's HYPHA_COMPILE: torch.compile its step (default auto, as a job: "
        "on a CUDA GPU with Triton and a C compiler); the bare loop stays eager",
    )
    p.add_argument("--rounds", type=int, default=3, help="DiLoCo rounds, the first is warm-up")
    p.add_argument("--steps-per-round", type=int, metavar="N", help="default: the model's")
    p.add_argument("--batch-size", type=int, metavar="N", help="default: the model's")
    p.add_argument(
        "--skip",
        default="",
        metavar="PART,...",
        help=f"parts not to run, of {', '.join(PARTS)}",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        metavar="X",
        help="the device's peak TFLOP/s for the precision trained, where the table knows none",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the findings as JSON")
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds the executor's job may take"
    )
    return p


def say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def choose_size(args: argparse.Namespace, host: Host) -> ModelSize:
    name = args.model if args.model != "auto" else ("gpt2-124m" if host.gpus else "tiny")
    size = SIZES[name]
    if args.steps_per_round is not None:
        size = replace(size, steps_per_round=args.steps_per_round)
    if args.batch_size is not None:
        size = replace(size, batch_size=args.batch_size)
    return size


def choose_precision(requested: str, host: Host) -> str:
    if requested != "auto":
        return requested
    return "bf16" if host.gpus and all(device.bf16 for device in host.devices) else "no"


def accelerate_config(
    requested: str, host: Host, processes: int, mixed_precision: str
) -> tuple[dict[str, Any], str]:
    """The config the launcher gets, and its name: `auto` is one process per GPU (or one on
    the CPU); a bundled name or a path is read as the launcher reads it. Either way its mixed
    precision and process count are this command's."""
    from hypha.accelerate_executor.platform.launcher.configs import configs_dir, read_config

    if requested == "auto":
        on_gpus = host.backend in ("cuda", "rocm")
        if processes == 1:
            config: dict[str, Any] = {"distributed_type": "NO"}
        else:
            config = {"distributed_type": "MULTI_GPU" if on_gpus else "MULTI_CPU"}
        config["use_cpu"] = host.backend == "cpu"
        name = "auto"
    else:
        path = Path(requested)
        if "/" not in requested and not requested.endswith((".yaml", ".yml")):
            path = configs_dir(os.environ) / f"{requested}.yaml"
        config = read_config(path)
        name = path.stem
    config.update(
        compute_environment="LOCAL_MACHINE",
        num_machines=1,
        machine_rank=0,
        num_processes=processes,
        mixed_precision=mixed_precision,
    )
    return config, f"{name} ({config['distributed_type']})"


@contextlib.contextmanager
def part(report: Report, name: str) -> Iterator[None]:
    """Runs one part of the test; its failure is recorded in the report, and the rest runs."""
    say(f"{name} ...")
    try:
        yield
    except Exception as exc:
        report.errors[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def parameter_counts(size: ModelSize) -> tuple[int, int]:
    """The model's parameters, and those multiplied in its products (all but the position
    embeddings), counted on a model built without memory."""
    import torch

    # Imported before the meta device is set: on torch 2.8, importing transformers' GPT-2
    # module under it fails (the import makes tensors of its own).
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401

    from hypha.selftest.workload import SelftestSpec
    from hypha.standin.data_service.assets import build_model

    with torch.device("meta"):
        model = build_model(SelftestSpec.of(size))
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.transformer.wpe.weight.numel()


def selftest(args: argparse.Namespace) -> int:
    skip = {name for name in args.skip.split(",") if name}
    if unknown := skip - set(PARTS):
        raise UsageError(
            f"--skip names no part {', '.join(sorted(unknown))}; parts: {', '.join(PARTS)}"
        )
    if args.rounds < 2:
        raise UsageError("--rounds must be at least 2: the first round is warm-up")

    import yaml  # type: ignore[import-untyped]  # no stubs in the dev env

    from hypha.accelerate_executor.protocol.generation import Ambiguous, parse_any_job_bytes
    from hypha.selftest import runs
    from hypha.selftest.workload import SelftestSpec
    from hypha.standin.data_service.assets import ensure_assets

    host = probe_host()
    size = choose_size(args, host)
    precision = choose_precision(args.mixed_precision, host)
    processes = args.num_processes or max(host.gpus, 1)
    config, config_name = accelerate_config(args.accelerate_config, host, processes, precision)
    total, multiplied = parameter_counts(size)
    report = Report(
        __version__, host, size, total, multiplied, precision, config_name, processes,
        args.bridge_generation, args.speculative_step, args.answer_delay_ms, args.compile,
    )  # fmt: skip
    say(f"{host.backend}, {len(host.devices)} device(s); {size.name}, {precision}, {config_name}")
    # The executor's lines (through the local worker) belong with the progress, not the table.
    with tempfile.TemporaryDirectory(prefix="hypha-selftest-") as temporary, \
            contextlib.redirect_stdout(sys.stderr):  # fmt: skip
        folder = Path(temporary)
        config_path = folder / "accelerate.yaml"
        config_path.write_text(yaml.safe_dump(config))
        assets = ensure_assets(spec=SelftestSpec.of(size))
        options = runs.job_options(size, args.rounds, args.bridge_generation)
        core, spec = runs.start_job(assets, options)
        job = parse_any_job_bytes(json.dumps(spec).encode(), args.bridge_generation)
        assert not isinstance(job, Ambiguous)  # a generation was named

        def bare() -> None:
            if "bare" not in skip:
                with part(report, "bare loop"):
                    report.bare.append(
                        runs.bare_loop(job, assets, size.steps_per_round, args.rounds, precision)
                    )

        bare()
        with part(report, "executor"):
            report.executor = runs.run_executor(
                core, spec, config_path, processes, folder, args.timeout,
                args.speculative_step, args.answer_delay_ms / 1e3, args.compile,
            )  # fmt: skip
        bare()
        auto = args.accelerate_config == "auto"
        run_device_checks(report, skip, auto, lambda: runs.oom_check(job, assets, precision))
    report.peak_tflops = args.peak_tflops
    if report.peak_tflops is None and host.gpus:
        report.peak_tflops = peak_tflops(host.devices[0].name, precision)
    if report.peak_tflops is None:
        report.skipped["MFU"] = (
            "no GPU"
            if not host.gpus
            else f"no peak known for {host.devices[0].name} (state it with --peak-tflops)"
        )
    verdict = judge(report)
    print(render(report, verdict), flush=True)
    if args.json:
        args.json.write_text(json.dumps(as_json(report, verdict), indent=2) + "\n")
    return verdict.exit_code


def run_device_checks(
    report: Report, skip: set[str], auto_config: bool, oom: Callable[[], Any]
) -> None:
    """The checks only GPUs have: micro-batching on the device's allocator, and the
    all-reduce between devices."""
    from hypha.selftest import runs

    host = report.host
    if "oom" in skip:
        report.skipped["OOM check"] = "--skip oom"
    elif host.backend not in ("cuda", "rocm"):
        report.skipped["OOM check"] = "no GPU (the CPU has no device allocator to run out of)"
    elif report.processes > 1 or not auto_config:
        report.skipped["OOM check"] = "runs with the auto config, one process"
    else:
        with part(report, "OOM check"):
            report.oom = oom()
    if "allreduce" in skip:
        report.skipped["all-reduce"] = "--skip allreduce"
    elif host.gpus < 2:
        report.skipped["all-reduce"] = "one device" if host.gpus else "no GPU"
    else:
        with part(report, "all-reduce"):
            report.allreduce_bytes_per_s = runs.allreduce_bus_bandwidth(host.gpus, "cuda")


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
        return selftest(args)

    return run_main(PROG, body, lambda exc: f"failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
