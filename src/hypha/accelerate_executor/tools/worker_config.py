"""`hypha-accelerate worker-config`: ready-to-paste `[[executors]]` entries for a worker's TOML.

    hypha-accelerate worker-config --variant V|auto [--mode shim|docker|both] [--user UID:GID]
                                   [--bundle DIR] [--registry HOST[:PORT][/PATH]]

`--variant auto` picks the variant this host runs best (gpus.pick_variant: the NVIDIA
driver's version against each CUDA variant's needs, ROCm's devices, Apple silicon) and says
why in a comment above the entries.

`--registry` names the image `hypha-accelerate publish` pushed there: pulled for this host's
architecture when the engine lacks it, and named in both entries by its registry digest,
which a comment states with the architecture, so the worker runs exactly that image.

The shim entry runs `hypha-accelerate run`; the docker entry has the worker run `docker run`
itself, with the same container the shim would create (spec.ContainerSpec renders both).
"""

from __future__ import annotations

import argparse
import json
import os

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_OK, ShimError
from hypha.accelerate_executor.platform.gpus import pick_variant, read_host
from hypha.accelerate_executor.platform.image_tags import (
    HOST_VARIANT,
    NVIDIA_VARIANTS,
    VARIANTS,
    image_tags,
)
from hypha.accelerate_executor.shim.container_spec import (
    LABEL_VARIANT,
    LABEL_WORK_DIR,
    ContainerSpec,
    default_shm_size,
    launcher_args,
)
from hypha.accelerate_executor.shim.run import USER_PATTERN, pattern_arg
from hypha.accelerate_executor.worker_facts import console_script

PROG = "hypha-accelerate worker-config"
# No {JOB_JSON}: the worker also exports the job as JOB_JSON, which the shim and the
# launcher read, so that no command line (readable by every local user) holds a token.
TOKENS = ("{SOCKET_PATH}", "{WORK_DIR}")
ENTRY_HEAD = 'class = "train"\nname = "diloco-transformer"\nruntime = "process"\n'

SHIM_NOTE = """\
# The shim runs the job's container hardened and as the work dir's owner, removes it within
# the worker's 5 s on SIGTERM (and, through its watchdog, after a SIGKILL), and keeps the job
# JSON (JOB_JSON, which may hold a Hugging Face token) out of `docker inspect` and every
# process list. The model's own code (remote code) runs in the network-less container."""

RELEASES_NOTE = """\
# Any Hypha release: the executor speaks v1.0.0-alpha.17 and earlier (the status protocol)
# and the releases after it (the action protocol), and picks the one of each job by itself;
# there is nothing to set. See docs/protocol-actions.md."""

DOCKER_NOTE = """\
# The worker runs `docker run` itself. NOTE: `--env JOB_JSON` hands the job to the container
# through its environment, which `docker inspect` shows to anyone who may use the Docker
# engine, Hugging Face tokens included; a SIGKILLed `docker run` leaves its container running
# until the executor notices its bridge is gone. Prefer the shim entry. A model's own code
# runs, as in the shim's container: keep --network none with HYPHA_TRUST_REMOTE_CODE=1.
# --user must stay the worker's uid:gid: the bridge socket is 0600."""


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description="Print worker TOML [[executors]] entries.")
    p.add_argument(
        "--variant",
        required=True,
        choices=[*VARIANTS, "auto"],
        help="a variant, or auto: the one this host runs best",
    )
    p.add_argument("--mode", choices=["shim", "docker", "both"], default="both")
    p.add_argument(
        "--user",
        type=pattern_arg(USER_PATTERN, "UID:GID"),
        help="uid:gid of the worker (docker entry); default: yours",
    )
    p.add_argument("--bundle", help=f"{HOST_VARIANT}: the bundle folder the shim runs")
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT][/PATH]",
        help="run the variant's image from this registry (pulled when missing, pinned by digest)",
    )
    return p


def _toml_array(args: list[str]) -> str:
    """One option with its value per line, for a reader of the worker's config."""
    lines: list[list[str]] = []
    for arg in args:
        if (
            lines
            and lines[-1][0].startswith("--")
            and len(lines[-1]) == 1
            and not arg.startswith("--")
        ):
            lines[-1].append(arg)
        else:
            lines.append([arg])
    body = "".join("    " + ", ".join(json.dumps(a) for a in line) + ",\n" for line in lines)
    return f"[\n{body}]"


def shim_entry(variant: str, bundle: str | None, image: str | None) -> str:
    args = ["run", "--variant", variant]
    if bundle:
        args += ["--bundle", bundle]
    if image:
        args += ["--image", image]
    args += launcher_args(*TOKENS)
    return f"{SHIM_NOTE}\n[[executors]]\n{ENTRY_HEAD}cmd = {json.dumps(console_script())}\nargs = {_toml_array(args)}\n"


def _rocm_groups() -> tuple[list[str], str]:
    from hypha.accelerate_executor.platform.accelerators import rocm_device_groups, rocm_present

    if rocm_present():
        return rocm_device_groups(), ""
    return ["video", "render"], (
        "# No /dev/kfd here: the groups are named; on the GPU host use the numeric gids that\n"
        "# own /dev/kfd and /dev/dri/renderD* (`stat -c %g /dev/kfd`).\n"
    )


def docker_entry(variant: str, user: str, image: str | None) -> str:
    devices: tuple[str, ...] = ()
    groups: list[str] = []
    note = ""
    if variant == "rocm64":
        from hypha.accelerate_executor.platform.accelerators import ROCM_DEVICES

        devices = ROCM_DEVICES
        groups, note = _rocm_groups()
    spec = ContainerSpec(
        image=image or image_tags(variant)[0],
        command=launcher_args(*TOKENS),
        user=user,
        work_dir="{WORK_DIR}",
        work_dir_source="{WORK_DIR}",
        shm_size=default_shm_size(variant),
        env={"HYPHA_TRUST_REMOTE_CODE": "1"},  # the shim's policy: sandboxed, no network
        env_from_caller=("JOB_JSON",),
        labels={LABEL_VARIANT: variant, LABEL_WORK_DIR: "{WORK_DIR}"},
        nvidia_gpus="all" if variant in NVIDIA_VARIANTS else None,
        devices=devices,
        group_add=tuple(groups),
    )
    return (
        f'{DOCKER_NOTE}\n{note}[[executors]]\n{ENTRY_HEAD}cmd = "docker"\n'
        f"args = {_toml_array(spec.docker_run_args())}\n"
    )


def check_built_for_host(variant: str) -> None:
    """A container variant must have an image of this host's architecture."""
    from hypha.accelerate_executor.platform.arch import host_arch
    from hypha.accelerate_executor.platform.variants import BUILDS

    arch = host_arch()
    if variant != HOST_VARIANT and (variant, arch) not in BUILDS:
        built = ", ".join(name for name, a in BUILDS if a == arch)
        raise ShimError(f"{variant} has no {arch} image; this host's variants: {built}")


def pinned_image(variant: str, registry: str) -> tuple[str, str]:
    """The registry's image of `variant` for this host, by digest, and a comment saying so."""
    from hypha.accelerate_executor.platform.arch import image_arch
    from hypha.accelerate_executor.shim.engine import connect, registry_image

    if variant == HOST_VARIANT:
        raise ShimError(f"{HOST_VARIANT} is a bundle, not an image: --registry does not apply")
    image = registry_image(connect(), registry, variant)
    return image.pinned, (
        f"# Image {image.tag} ({image.digest}), linux/{image_arch(image.inspected)} "
        f"on this host: image id {image.inspected.get('Id')}.\n"
    )


def render(variant: str, mode: str, user: str, bundle: str | None, image: str | None = None) -> str:
    if variant == HOST_VARIANT:
        if mode == "docker":
            raise ShimError(f"{HOST_VARIANT} is not a container: use --mode shim")
        if not bundle:
            raise ShimError(
                f"{HOST_VARIANT} needs --bundle DIR, the folder `hypha-accelerate build "
                f"{HOST_VARIANT}` made",
            )
        bundle = os.path.abspath(bundle)
        mode = "shim"
    elif bundle:
        raise ShimError(f"--bundle applies to {HOST_VARIANT} only")
    parts = [
        f"# Hypha worker executor entries: hypha-accelerate executor, variant {variant}.\n"
        "# The worker replaces {SOCKET_PATH} and {WORK_DIR} in every argument and exports the\n"
        "# job as JOB_JSON.",
        RELEASES_NOTE,
    ]
    if mode == "both":
        parts.append("# Paste ONE of the two entries below (both serve the same executor name).")
    if mode in ("shim", "both"):
        parts.append(shim_entry(variant, bundle, image))
    if mode in ("docker", "both"):
        parts.append(docker_entry(variant, user, image))
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    def body() -> int:
        args = parser().parse_args(argv)
        user = args.user or f"{os.getuid()}:{os.getgid()}"
        variant, chosen = args.variant, ""
        if variant == "auto":
            variant, why = pick_variant(read_host(os.environ))
            chosen = f"# --variant auto chose {variant}: {why}.\n"
        check_built_for_host(variant)
        image, pinned = pinned_image(variant, args.registry) if args.registry else (None, "")
        print(chosen + pinned + render(variant, args.mode, user, args.bundle, image), end="")
        return EXIT_OK

    return run_main(PROG, body)
