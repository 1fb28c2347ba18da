"""`hypha-accelerate run`: what the Hypha worker starts for one job.

    hypha-accelerate run --variant VARIANT --socket S --work-dir W
        [--job J] [--image IMG] [--bundle DIR] [--user UID:GID] [--network none|NAME]
        [--gpus all|0,1] [--accelerate-config auto|NAME|PATH] [--num-processes N]
        [--memory 8g] [--shm-size 8g | --ipc host] [--pids-limit N]
        [--trust-remote-code | --no-remote-code]

VARIANT is one of platform/variants.py's (`--help` lists them). Runs the variant's image with
WORK_DIR (and so the bridge socket) bind-mounted at the same path, as the uid:gid owning
WORK_DIR, with no network and no capabilities, and re-prints the executor's output line by
line; `mps-host` runs the bundle as a host process instead.
The job comes from JOB_JSON, which the Hypha worker sets, unless --job gives it: on a
command line it would show in every local user's process list, tokens included.
Exits with the executor's exit code; 143/130 when cancelled by SIGTERM/SIGINT; 2 for bad
arguments or job; 125 when Docker cannot run the container.

Remote code (a model repository's own Python, e.g. upstream's LeNet) runs only sandboxed:
in a container without network it is allowed unless --no-remote-code; with --network NAME
or on the host (mps-host) only with --trust-remote-code.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main, say_error
from hypha.accelerate_executor.errors import DockerError, ShimError
from hypha.accelerate_executor.platform.accelerators import (
    ROCM_DEVICES,
    require_nvidia_runtime,
    rocm_device_groups,
)
from hypha.accelerate_executor.platform.image_tags import (
    GPU_VARIANTS,
    HOST_VARIANT,
    NVIDIA_VARIANTS,
    VARIANTS,
)
from hypha.accelerate_executor.platform.variants import BY_NAME
from hypha.accelerate_executor.protocol.generation import parse_any_job_bytes
from hypha.accelerate_executor.protocol.job import job_bytes
from hypha.accelerate_executor.shim import compile_cache
from hypha.accelerate_executor.shim.container import run_container
from hypha.accelerate_executor.shim.container_spec import (
    DEFAULT_PIDS_LIMIT,
    LABEL_JOB_ID,
    LABEL_VARIANT,
    LABEL_WORK_DIR,
    ContainerSpec,
    default_shm_size,
    launcher_args,
)
from hypha.accelerate_executor.shim.engine import connect, find_image, root_cause
from hypha.accelerate_executor.shim.hub_upload import FolderRefused, HubUpload, private_copy
from hypha.accelerate_executor.shim.jobfile import write_job_file
from hypha.accelerate_executor.shim.mount_source import host_path
from hypha.accelerate_executor.shim.mps_bundle import run_bundle
from hypha.accelerate_executor.shim.otlp_relay import OtlpRelay
from hypha.accelerate_executor.shim.otlp_upstream import (
    TelemetryConfigError,
    Upstream,
    upstream_from,
)
from hypha.accelerate_executor.shim.reaper import shim_labels
from hypha.accelerate_executor.supervisor import Interrupts

if TYPE_CHECKING:
    from docker import APIClient

PROG = "hypha-accelerate run"
_SIZE = re.compile(r"\d+(\.\d+)?[bkmgBKMG]?")
USER_PATTERN = re.compile(r"\d+:\d+")
_GPUS = re.compile(r"all|[\w-]+(,[\w-]+)*")
# The shim's variables the executor keeps. OMP_NUM_THREADS: executors sharing a host each take
# their share of its cores, since oversubscribed torch threads slow every one of them down
# several times. QEMU_CPU: on an emulated arm64 host (QEMU user mode), the CPU model the
# executor is emulated as, the shim's own: QEMU's default, `max`, has SVE, whose emulation
# makes torch's matmuls 15-20 times slower than NEON's (docs/images.md).
FORWARDED_ENV = ("OMP_NUM_THREADS", "QEMU_CPU")
MODEL_DIR_VARIABLE = "HYPHA_MODEL_DIR"
KEPT_MODEL_DIR = "kept-model"  # in the work dir: where the executor keeps the final model


def pattern_arg(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return value

    return check


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return int(value)


def parser() -> argparse.ArgumentParser:
    size = pattern_arg(_SIZE, "a size like 8g")
    p = OneLineArgumentParser(
        prog=PROG, description="Run one Hypha job's executor container (or bundle)."
    )
    p.add_argument("--variant", required=True, choices=VARIANTS)
    p.add_argument("--socket", required=True, help="the job bridge's socket, inside WORK_DIR")
    p.add_argument("--work-dir", required=True, help="the job's work directory")
    p.add_argument(
        "--job",
        default=os.environ.get("JOB_JSON"),
        help="the job spec JSON, or @PATH of a file with it; default: $JOB_JSON",
    )
    p.add_argument(
        "--image",
        default=os.environ.get("HYPHA_ACCELERATE_IMAGE"),
        help="image to run instead of the variant's (default: $HYPHA_ACCELERATE_IMAGE)",
    )
    p.add_argument("--bundle", help="mps-host: the bundle folder (hypha-accelerate build mps-host)")
    p.add_argument(
        "--user",
        type=pattern_arg(USER_PATTERN, "UID:GID"),
        help="uid:gid to run as; default: the owner of WORK_DIR (the worker's user)",
    )
    p.add_argument("--network", default="none", help="container network; default none")
    p.add_argument(
        "--gpus",
        type=pattern_arg(_GPUS, "all or a list of GPU ids"),
        help="GPU variants: all (default) or device ids like 0,1",
    )
    p.add_argument("--accelerate-config", metavar="auto|NAME|PATH", help="passed to the launcher")
    p.add_argument("--num-processes", type=_positive, metavar="N", help="passed to the launcher")
    p.add_argument("--memory", type=size, help="memory limit, e.g. 8g (no swap on top)")
    shm = p.add_mutually_exclusive_group()
    shm.add_argument("--shm-size", type=size, help="/dev/shm size; default 1g cpu, 8g GPU")
    shm.add_argument("--ipc", choices=["host"], help="share the host's IPC namespace instead")
    p.add_argument("--pids-limit", type=_positive, metavar="N", help="default 4096")
    remote = p.add_mutually_exclusive_group()
    remote.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a model's own code run with a network or on the host too",
    )
    remote.add_argument(
        "--no-remote-code",
        action="store_true",
        help="refuse a model's own code even in the sandboxed container",
    )
    return p


def remote_code_allowed(args: argparse.Namespace) -> bool:
    """A model's own code may run where it can do no harm beyond the job: in the container,
    which has no network, a read-only root, no capabilities and no privileges to gain."""
    if args.no_remote_code:
        return False
    sandboxed = args.variant != HOST_VARIANT and args.network == "none"
    return sandboxed or args.trust_remote_code


def _check_combinations(args: argparse.Namespace) -> None:
    if args.variant == HOST_VARIANT:
        container_only = ("image", "user", "gpus", "memory", "shm_size", "ipc", "pids_limit")
        given = [f"--{n.replace('_', '-')}" for n in container_only if getattr(args, n)]
        if args.network != "none":
            given.append("--network")
        if given:
            raise ShimError(
                f"{', '.join(given)} apply to containers; {HOST_VARIANT} runs on the host",
            )
    elif args.bundle:
        raise ShimError(f"--bundle applies to {HOST_VARIANT} only")
    if args.gpus and args.variant not in GPU_VARIANTS:
        raise ShimError(f"--gpus applies to {', '.join(GPU_VARIANTS)}")


def _check_paths(work_dir: str, socket: str) -> None:
    if not os.path.isdir(work_dir):
        raise ShimError(f"work dir {work_dir} does not exist or is not a directory")
    try:
        mode = os.stat(socket).st_mode
    except FileNotFoundError:
        raise ShimError(
            f"socket {socket} does not exist (the worker serves the job bridge there)",
        ) from None
    if not stat.S_ISSOCK(mode):
        raise ShimError(f"socket {socket} is not a Unix socket")
    if os.path.commonpath([work_dir, socket]) != work_dir:
        raise ShimError(
            f"socket {socket} is outside work dir {work_dir}; only the work dir is mounted",
        )


def _owner(path: str, user: str | None) -> tuple[int, int]:
    if user:
        uid, gid = user.split(":")
        return int(uid), int(gid)
    st = os.stat(path)
    return st.st_uid, st.st_gid


def run(args: argparse.Namespace, interrupts: Interrupts) -> int:
    _check_combinations(args)
    work_dir = os.path.abspath(args.work_dir)
    socket = os.path.abspath(args.socket)
    _check_paths(work_dir, socket)
    if args.job is None:
        raise ShimError("the job is missing: give --job, or set JOB_JSON")
    data = job_bytes(args.job)
    # Either generation's job (the executor in the container tells which the bridge speaks).
    job = parse_any_job_bytes(data)
    job_id = job.job_id
    uid, gid = _owner(work_dir, args.user)
    job_path = write_job_file(work_dir, data, uid, gid)
    command = launcher_args(
        socket, work_dir, "@" + job_path, args.accelerate_config, args.num_processes
    )
    env = {"HYPHA_TRUST_REMOTE_CODE": "1"} if remote_code_allowed(args) else {}
    env.update({name: os.environ[name] for name in FORWARDED_ENV if name in os.environ})
    if args.variant == HOST_VARIANT:
        return run_bundle(args.bundle, command, env, interrupts)
    return _run_container(args, job_id, work_dir, (uid, gid), command, env, interrupts)


def _run_container(
    args: argparse.Namespace,
    job_id: str,
    work_dir: str,
    owner: tuple[int, int],
    command: list[str],
    env: dict[str, str],
    interrupts: Interrupts,
) -> int:
    api = connect()
    image = find_image(api, args.variant, args.image)
    devices: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    if args.variant in NVIDIA_VARIANTS:
        require_nvidia_runtime(api, args.variant)
    elif BY_NAME[args.variant].accelerator == "rocm":
        devices, groups = ROCM_DEVICES, tuple(rocm_device_groups())
        if args.gpus and args.gpus != "all":
            # /dev/dri holds every GPU's render node; ROCm narrows to the listed ones.
            env["ROCR_VISIBLE_DEVICES"] = args.gpus
    work_dir_source = host_path(api, work_dir)
    relay = _start_relay(work_dir, owner)  # stopped below, whatever happens after this
    if relay is not None:
        env.update(relay.container_env(os.environ))
    # push-to-hub from the host (shim/hub_upload.py): the container keeps no network.
    hub_upload = HubUpload(work_dir, owner)
    try:
        hub_upload.start()
    except OSError as exc:
        _say(f"push-to-hub off: cannot serve {hub_upload.socket_path}: {exc.strerror or exc}")
    else:
        env.update(hub_upload.container_env())
    # HYPHA_MODEL_DIR names a host directory, which the container never sees: the executor
    # keeps the model in the work dir, and the shim copies it there once the container ends.
    host_model_dir = os.environ.get(MODEL_DIR_VARIABLE) or None
    if host_model_dir is not None:
        env[MODEL_DIR_VARIABLE] = os.path.join(work_dir, KEPT_MODEL_DIR)
    binds = _compile_cache(api, image, owner, env)
    spec = ContainerSpec(
        image=image,
        command=command,
        user=f"{owner[0]}:{owner[1]}",
        work_dir=work_dir,
        work_dir_source=work_dir_source,
        network=args.network,
        env=env,
        labels={
            LABEL_JOB_ID: job_id,
            LABEL_VARIANT: args.variant,
            LABEL_WORK_DIR: work_dir,
            **shim_labels(),
        },
        memory=args.memory,
        ipc_host=args.ipc == "host",
        shm_size=None if args.ipc else args.shm_size or default_shm_size(args.variant),
        pids_limit=args.pids_limit or DEFAULT_PIDS_LIMIT,
        nvidia_gpus=(args.gpus or "all") if args.variant in NVIDIA_VARIANTS else None,
        devices=devices,
        group_add=groups,
        binds=binds,
    )
    try:
        outcome = run_container(api, spec, interrupts)
    finally:
        if relay is not None:
            relay.stop()
        hub_upload.stop()
    if host_model_dir is not None:
        _copy_kept_model(work_dir, job_id, host_model_dir)
    if outcome.cancelled_by:
        _say(f"cancelled by {outcome.cancelled_by}; container stopped (exit {outcome.exit_code})")
        return interrupts.exit_code
    if outcome.oom_killed:
        limit = f" (memory limit {args.memory})" if args.memory else ""
        _say(
            f"the executor ran out of memory: the container was OOM-killed{limit}, "
            f"exit {outcome.exit_code}"
        )
    return outcome.exit_code


def _compile_cache(
    api: APIClient, image: str, owner: tuple[int, int], env: dict[str, str]
) -> tuple[tuple[str, str], ...]:
    """The compile cache's bind mount, and its variables added to `env`, when the worker set
    HYPHA_COMPILE_CACHE (shim/compile_cache.py); a cache that cannot be had costs the job
    nothing but one line."""
    root = os.environ.get(compile_cache.CACHE_VARIABLE)
    if not root:
        return ()
    try:
        folder = compile_cache.cache_folder(root, api.inspect_image(image)["Id"], owner)
        source = host_path(api, str(folder), "compile cache")
    except (compile_cache.CompileCacheRefused, DockerError) as exc:
        _say(f"compile cache off: {exc}")
        return ()
    env.update(compile_cache.container_env())
    return ((source, compile_cache.CONTAINER_PATH),)


def _copy_kept_model(work_dir: str, job_id: str, host_model_dir: str) -> None:
    """The model the executor kept at terminate (WORK_DIR/kept-model/JOB_ID), copied into
    HYPHA_MODEL_DIR/JOB_ID on the host as the shim's user: regular files only, never a link
    the container made. None kept (a job ended early) is one line, never a failure."""
    kept = os.path.join(work_dir, KEPT_MODEL_DIR, job_id)
    if not os.path.isdir(kept):
        _say(f"no model kept for {host_model_dir}: the executor wrote none")
        return
    destination = Path(host_model_dir) / job_id
    try:
        if destination.exists():
            shutil.rmtree(destination)
        destination.mkdir(parents=True)
        names = private_copy(kept, work_dir, destination)
    except (FolderRefused, OSError) as exc:
        _say(f"the model was not kept in {host_model_dir}: {exc}")
        return
    _say(f"kept the model in {destination}: {', '.join(names)}")


def _start_relay(work_dir: str, owner: tuple[int, int]) -> OtlpRelay | None:
    """The telemetry relay (docs/telemetry.md) when the worker configured OTLP. Telemetry
    that cannot be relayed costs the job nothing: it runs without, and one line says why."""
    try:
        upstream: Upstream | None = upstream_from(os.environ)
    except TelemetryConfigError as exc:
        _say(f"telemetry off: {exc}")
        return None
    except ImportError:
        _say("telemetry off: the shim needs opentelemetry-api (the [shim] extra)")
        return None
    if upstream is None:
        return None
    try:
        relay = OtlpRelay(work_dir, upstream, owner)
    except TelemetryConfigError as exc:  # gRPC asked for, and no grpcio here
        _say(f"telemetry off: {exc}")
        return None
    try:
        relay.start()
    except OSError as exc:
        _say(f"telemetry off: cannot serve {relay.socket_path}: {exc.strerror or exc}")
        return None
    return relay


def _say(line: str) -> None:
    say_error(PROG, line)


def _unexpected(exc: Exception) -> str:
    """A bug or an engine answer nobody foresaw: still one line."""
    return f"unexpected {type(exc).__name__}: {' '.join(root_cause(exc).split())}"


def main(argv: list[str]) -> int:
    return run_main(PROG, lambda: run(parser().parse_args(argv), Interrupts()), _unexpected)
