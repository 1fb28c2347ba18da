"""What the image runs for a job: choose an accelerate config, start the training ranks, pass signals on.

    python -m hypha.accelerate_executor.platform.launcher --socket S --work-dir W [--job J]
        [--accelerate-config auto|NAME|PATH] [--num-processes N] [--print-config]

J, the job JSON or @PATH, defaults to $JOB_JSON, which keeps a token off every command line.

`auto` picks from the image's variant (HYPHA_VARIANT) and the GPUs the container sees:
none -> cpu.yaml (multi-cpu.yaml for several processes; a GPU image says so in a warning
line), one -> gpu.yaml, several -> multi-gpu.yaml with one process per GPU. A
single-process, non-distributed config starts the training module directly with the
environment `accelerate launch` would give it: accelerate's own launcher costs seconds of
start-up and adds nothing for one process. Everything else goes through `accelerate launch`.

The ranks run in their own process group (supervisor.py). SIGTERM/SIGINT/SIGHUP go to the
whole group (the worker signals only its direct child, and the container may run without
--init); whatever is left after the grace period is killed, so a cancelled job is gone
within 3 seconds.

No torch import in this process: GPUs are counted from /dev and the *_VISIBLE_DEVICES
variables. When an image got GPUs, two checks run before any rank starts (platform/gpus.py): an
NVIDIA image reads the host driver's version and says in one line whether it runs natively
or through minor-version compatibility, or ends (exit 2) naming the driver it needs and the
variant that would run on this host; then a short child process asks torch whether it can
use them, and the launch ends (exit 2) when it cannot: GPUs handed in are never left idle
while the job trains on the CPU. The CPU fallback, with a warning, is only for a GPU image
started without any GPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_OK, LaunchError
from hypha.accelerate_executor.platform.gpus import describe as describe_verdict
from hypha.accelerate_executor.platform.gpus import dev_dir, nvidia_nodes, read_driver, verdict
from hypha.accelerate_executor.platform.variants import BY_NAME, NAMES, VARIANTS
from hypha.accelerate_executor.supervisor import Interrupts, Supervisor

TRAINING_MODULE = "hypha.accelerate_executor.training"
PROG = "launcher"  # what its lines start with
AMD_VENDOR_ID = "0x1002"


@dataclass(frozen=True)
class Plan:
    """What the launcher will run, for one job."""

    variant: str
    gpus: int
    config_path: Path
    how_chosen: str
    num_processes: int
    distributed_type: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def direct(self) -> bool:
        return self.command[1:3] == ["-m", TRAINING_MODULE]


def configs_dir(env: Mapping[str, str]) -> Path:
    """The bundled accelerate configs: the image sets HYPHA_ACCELERATE_CONFIGS; a source
    checkout has them at its root."""
    given = env.get("HYPHA_ACCELERATE_CONFIGS")
    return Path(given) if given else Path(__file__).resolve().parents[4] / "accelerate-configs"


def image_variant(env: Mapping[str, str], dev: Path = Path("/dev")) -> str:
    """The variant baked into the image; outside one (a source checkout), the kind of GPU
    present stands for it."""
    variant = env.get("HYPHA_VARIANT")
    if variant is None:
        present = "rocm" if (dev / "kfd").exists() else "nvidia" if nvidia_nodes(dev) else "cpu"
        return next(v.name for v in VARIANTS if v.accelerator == present)
    if variant not in NAMES:
        raise LaunchError(f"HYPHA_VARIANT={variant!r} is not one of {', '.join(NAMES)}")
    return variant


def _visible_limit(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    """How many devices the first set *_VISIBLE_DEVICES variable admits (None: unset)."""
    for name in names:
        value = env.get(name)
        if value is not None:
            entries = [e for e in value.split(",") if e.strip()]
            # CUDA treats an invalid entry as the end of the list; -1 is the usual "none".
            return 0 if not entries or entries[0].strip() == "-1" else len(entries)
    return None


def count_gpus(
    variant: str, env: Mapping[str, str], dev: Path = Path("/dev"), sys_root: Path = Path("/sys")
) -> int:
    """GPUs this process may use. The NVIDIA runtime and `--device` put only the granted
    devices into the container's /dev, so the nodes there are the truth; the visibility
    variables can narrow them further."""
    accelerator = BY_NAME[variant].accelerator
    if accelerator == "nvidia":
        found = len(nvidia_nodes(dev))
        limit = _visible_limit(env, ("CUDA_VISIBLE_DEVICES",))
    elif accelerator == "rocm":
        if not (dev / "kfd").exists():
            return 0
        # Render nodes of other vendors (an integrated GPU, say) may sit beside AMD's.
        found = sum(
            1
            for node in (dev / "dri").glob("renderD*")
            if _read(sys_root / "class" / "drm" / node.name / "device" / "vendor") == AMD_VENDOR_ID
        )
        limit = _visible_limit(
            env, ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
        )
    elif accelerator == "mps":
        return 1
    else:
        return 0
    return found if limit is None else min(found, limit)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def gpu_image_without_gpus(variant: str, gpus: int) -> bool:
    return BY_NAME[variant].gpu and gpus == 0


def check_driver(variant: str, gpus: int, env: Mapping[str, str], dev: Path = Path("/dev")) -> str:
    """For an NVIDIA image handed GPUs: the line saying how the host's driver runs it. A
    driver too old for it, or none to be found, ends the launch with that line."""
    driver = read_driver(env)
    found = verdict(BY_NAME[variant], driver.version)
    if driver.version is None:
        nodes = ", ".join(str(p) for p in nvidia_nodes(dev)) or f"{gpus} GPU(s)"
        raise LaunchError(
            f"GPUs were handed to the container ({nodes}) but no NVIDIA driver version is "
            f"readable ({driver.source}); the {variant} image "
            f"({BY_NAME[variant].runtime_name()}) needs a driver {found.needs()}: "
            "give it the GPUs through the NVIDIA container toolkit (--gpus)"
        )
    if not found.runs:
        raise LaunchError(describe_verdict(found))
    return f"{describe_verdict(found)} (from {driver.source})"


# Run in a child, so that no CUDA context stays in the launcher while the ranks train.
CUDA_PROBE = """\
import torch
if torch.cuda.is_available() and torch.cuda.device_count() > 0:
    print("ok", torch.cuda.device_count())
else:
    try:
        torch.cuda.init()
        print("unusable: torch.cuda.is_available() is False")
    except Exception as exc:
        print("unusable:", (str(exc).strip().splitlines() or [type(exc).__name__])[-1])
"""


def require_usable_gpus(variant: str, gpus: int, env: Mapping[str, str]) -> None:
    """GPUs were handed in: torch must be able to use them, or the launch ends here."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", CUDA_PROBE],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise LaunchError("asking torch for the GPUs took over 300 s; not starting") from None
    answer = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0 or not answer.startswith("ok"):
        why = (
            answer.removeprefix("unusable: ")
            or (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        )
        raise LaunchError(
            f"{gpus} GPU(s) were handed to the {variant} container but torch cannot use them "
            f"({why}); not training on the CPU instead"
        )


def resolve_config(
    requested: str, variant: str, gpus: int, num_processes: int | None, directory: Path
) -> tuple[Path, str]:
    """The config file for `--accelerate-config` (bundled ones in `directory`) and a note on
    how it was chosen."""
    if requested != "auto":
        path = Path(requested)
        if "/" not in requested and not requested.endswith((".yaml", ".yml")):
            path = directory / f"{requested}.yaml"
            if not path.is_file():
                names = sorted(p.stem for p in directory.glob("*.yaml"))
                raise LaunchError(
                    f"no accelerate config named {requested!r}; bundled: {', '.join(names) or 'none'} "
                    "(or pass a path to a YAML file)"
                )
        elif not path.is_file():
            raise LaunchError(f"accelerate config {requested} does not exist")
        return path, "given"
    if BY_NAME[variant].accelerator == "mps":
        name = "mps"
    elif variant == "cpu" or gpus == 0:
        name = "multi-cpu" if (num_processes or 1) > 1 else "cpu"
        if gpu_image_without_gpus(variant, gpus):
            # main says this on stdout: a GPU image without GPUs usually lacks a runtime flag.
            runtime = (
                "--gpus all"
                if BY_NAME[variant].accelerator == "nvidia"
                else "--device /dev/kfd --device /dev/dri"
            )
            return directory / f"{name}.yaml", (
                f"auto: the {variant} image sees no GPU, so it trains on the CPU "
                f"(run the container with {runtime} for the GPU)"
            )
    else:
        name = "gpu" if (num_processes or gpus) == 1 else "multi-gpu"
    return directory / f"{name}.yaml", f"auto: variant {variant}, {gpus} GPU(s) visible"


def read_config(path: Path) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped]  # no stubs in the dev env

    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise LaunchError(f"cannot read accelerate config {path}: {reason}") from None
    if not isinstance(loaded, dict) or "distributed_type" not in loaded:
        raise LaunchError(f"accelerate config {path} is not a mapping with a distributed_type")
    return loaded


def free_port() -> int:
    """A free loopback port for the ranks' rendezvous, so that containers sharing the host
    network (or several jobs on one host) do not collide on accelerate's fixed 29500."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plan(
    args: argparse.Namespace,
    env: Mapping[str, str],
    dev: Path = Path("/dev"),
    sys_root: Path = Path("/sys"),
) -> Plan:
    variant = image_variant(env, dev)
    gpus = count_gpus(variant, env, dev, sys_root)
    path, how = resolve_config(
        args.accelerate_config, variant, gpus, args.num_processes, configs_dir(env)
    )
    config = read_config(path)
    distributed = str(config["distributed_type"])
    if distributed == "NO":
        processes = args.num_processes or 1
        if processes != 1:
            raise LaunchError(
                f"accelerate config {path.name} runs one process (distributed_type NO), "
                f"not {processes}; choose multi-gpu or multi-cpu"
            )
    elif args.num_processes:
        processes = args.num_processes
    elif distributed == "MULTI_CPU" or config.get("use_cpu"):
        processes = int(config.get("num_processes") or 1)
    elif gpus == 0:
        raise LaunchError(
            f"accelerate config {path.name} ({distributed}) needs GPUs and this container sees none; "
            "pass --num-processes to override"
        )
    else:
        processes = gpus

    training_args = [
        "-m", TRAINING_MODULE,
        "--socket", args.socket or "{SOCKET_PATH}",
        "--work-dir", args.work_dir or "{WORK_DIR}",
    ]  # fmt: skip
    # Without --job the ranks read JOB_JSON from the environment they inherit: nothing
    # secret on any command line.
    if args.job:
        training_args += ["--job", args.job]
    extra_env: dict[str, str] = {}
    if distributed == "NO":
        # What `accelerate launch` exports for one process, without its start-up cost.
        dynamo = (config.get("dynamo_config") or {}).get("dynamo_backend", "no")
        extra_env = {
            "ACCELERATE_USE_CPU": str(bool(config.get("use_cpu"))),
            "ACCELERATE_MIXED_PRECISION": str(config.get("mixed_precision") or "no").lower(),
            "ACCELERATE_DYNAMO_BACKEND": str(dynamo).upper(),
        }
        command = [sys.executable, *training_args]
    else:
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(path),
            "--num_processes", str(processes),
            "--main_process_port", str(free_port()),
        ]  # fmt: skip
        if distributed == "MULTI_CPU":
            # accelerate runs MULTI_CPU through mpirun, which the image lacks; its torchrun
            # path starts the ranks, and this variable puts each of them on the CPU.
            command.append("--multi_gpu")
            extra_env["ACCELERATE_USE_CPU"] = "True"
        command += training_args
    return Plan(variant, gpus, path, how, processes, distributed, command, extra_env)


def require_writable_home(env: Mapping[str, str]) -> None:
    """Every cache lives under HOME (/tmp in the image); on a read-only root fs without a
    tmpfs there, the job would fail deep inside a library instead of here."""
    home = env.get("HOME")
    if home and not os.access(home, os.W_OK):
        raise LaunchError(
            f"HOME {home} is not writable: give the container a tmpfs there (--tmpfs {home})"
        )


def redacted(command: Sequence[str]) -> str:
    """The command line for humans: the job JSON may carry tokens, so only its size shows."""
    shown: list[str] = []
    for i, arg in enumerate(command):
        if i > 0 and command[i - 1] == "--job" and not arg.startswith("@") and arg != "{JOB_JSON}":
            arg = f"<job JSON, {len(arg.encode())} bytes>"
        shown.append(arg if arg and " " not in arg else repr(arg))
    return " ".join(shown)


def describe(p: Plan) -> str:
    lines = [
        f"variant: {p.variant}",
        f"gpus visible: {p.gpus}",
        f"accelerate config: {p.config_path} ({p.how_chosen})",
        f"distributed type: {p.distributed_type}",
        f"num processes: {p.num_processes}",
        "launch: "
        + ("training module directly (one process)" if p.direct else "accelerate launch"),
        "env: " + (" ".join(f"{k}={v}" for k, v in p.env.items()) or "-"),
        f"command: {redacted(p.command)}",
        f"--- {p.config_path.name}",
        p.config_path.read_text().rstrip(),
    ]
    return "\n".join(lines)


def run_ranks(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs the ranks to their end; 128 + the signal when SIGTERM, SIGINT or SIGHUP ended them."""
    interrupts = Interrupts((signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    code = Supervisor(interrupts).run(command, env)
    return interrupts.exit_code if interrupts.signum is not None else code


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
