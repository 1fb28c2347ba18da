"""`hypha-accelerate doctor`: can this host run the executor, and which variants?

    hypha-accelerate doctor [--work-dir-base DIR] [--image IMG] [--registry HOST[:PORT][/PATH]]

Checks the host's GPUs (the NVIDIA driver's version, ROCm's devices) and, per variant,
whether this host runs it and how (natively or through CUDA minor-version compatibility),
the Docker engine, the image of every variant, the GPU runtimes, the worker's work dir base,
and finally runs the cpu image's launcher the way the shim runs a job (hardened, as this
user, the work dir bind-mounted). Prints one row per check and a verdict; exits 0 when the
cpu path works.

Images are this host's architecture's (an image of another one would run emulated: FAIL),
each shown with its registry digest or image id. With `--registry`, the images are the ones
`hypha-accelerate publish` pushed there; the cpu image, which doctor runs, is pulled when
missing.
"""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_FAILED, EXIT_OK, ShimError
from hypha.accelerate_executor.platform.gpus import Host, can_run, pick_variant, read_host
from hypha.accelerate_executor.platform.image_tags import (
    CONTAINER_VARIANTS,
    NVIDIA_VARIANTS,
    build_command,
    image_tags,
)
from hypha.accelerate_executor.platform.variants import VARIANTS
from hypha.accelerate_executor.worker_facts import MAX_SOCKET_PATH_BYTES, SOCKET_SUFFIX_BYTES

if TYPE_CHECKING:
    from docker import APIClient

PROG = "hypha-accelerate doctor"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, missing, warn, FAIL, skipped; "runs V" rows: ok or no
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _checked(name: str, run: Callable[[], Check]) -> Check:
    """A check that raises is a failed check, not a traceback."""
    from hypha.accelerate_executor.shim.engine import root_cause

    try:
        return run()
    except ShimError as exc:
        return Check(name, "FAIL", str(exc))
    except Exception as exc:
        return Check(name, "FAIL", " ".join(root_cause(exc).split()))


def check_engine(api: APIClient) -> Check:
    from hypha.accelerate_executor.shim.engine import engine_address

    version = api.version()
    return Check(
        "docker engine",
        "ok",
        f"{version.get('Version')} (API {version.get('ApiVersion')}) at {engine_address()}",
    )


def check_image(
    api: APIClient, variant: str, tags: tuple[str, ...], registry: str | None = None
) -> Check:
    from docker.errors import ImageNotFound

    from hypha.accelerate_executor.shim.engine import check_arch, registry_image

    if registry and variant == "cpu":
        image = registry_image(api, registry, variant)
        return Check(f"image {variant}", "ok", image_detail(image.pinned, image.inspected))
    for tag in tags:
        try:
            found = api.inspect_image(tag)
        except ImageNotFound:
            continue
        check_arch(tag, found)
        return Check(f"image {variant}", "ok", image_detail(tag, found))
    how = f"pull it with `docker pull {tags[0]}`" if registry else ""
    return Check(f"image {variant}", "missing", how or f"build it with `{build_command(variant)}`")


def image_detail(tag: str, found: dict[str, object]) -> str:
    size = int(str(found.get("Size", 0)))
    return f"{tag} ({size / 1e9:.1f} GB, linux/{found.get('Architecture')}, id {found.get('Id')})"


def check_nvidia(api: APIClient) -> Check:
    from hypha.accelerate_executor.platform.accelerators import nvidia_runtime_present

    variants = "/".join(NVIDIA_VARIANTS)
    if nvidia_runtime_present(api):
        return Check("nvidia runtime", "ok", f"{variants} containers can get GPUs")
    return Check(
        "nvidia runtime",
        "missing",
        f"{variants} cannot run here (install nvidia-container-toolkit, "
        "`nvidia-ctk runtime configure --runtime=docker`)",
    )


def check_rocm() -> Check:
    from hypha.accelerate_executor.platform.accelerators import rocm_device_groups, rocm_present

    if not rocm_present():
        return Check("rocm devices", "missing", "no /dev/kfd or /dev/dri: rocm64 cannot run here")
    groups = rocm_device_groups()
    return Check("rocm devices", "ok", f"/dev/kfd, /dev/dri; groups {', '.join(groups) or '-'}")


def check_nvidia_driver(host: Host) -> Check:
    name = "nvidia driver"
    if host.driver is None:
        return Check(name, "missing", "no NVIDIA GPU on this host (no /dev/nvidia<N>)")
    gpus = f"{len(host.nvidia)} GPU(s): {', '.join(str(p) for p in host.nvidia)}"
    if host.driver.version is None:
        return Check(name, "FAIL", f"{gpus}, but no driver version ({host.driver.source})")
    return Check(name, "ok", f"{host.driver.version} (from {host.driver.source}); {gpus}")


def host_checks(host: Host) -> list[Check]:
    """The host's GPUs, whether it runs each variant and how, and the one `auto` picks."""
    runs = []
    for v in VARIANTS:
        ok, how = can_run(host, v)
        runs.append(Check(f"runs {v.name}", "ok" if ok else "no", how))
    best, why = pick_variant(host)
    return [
        check_nvidia_driver(host),
        *runs,
        Check("best variant", "ok", f"{best}: {why}"),
    ]


def check_work_dir_base(base: str) -> Check:
    name = "work dir base"
    try:
        st = os.stat(base)
    except OSError as exc:
        return Check(name, "FAIL", f"{base}: {exc.strerror}")
    if not stat.S_ISDIR(st.st_mode):
        return Check(name, "FAIL", f"{base} is not a directory")
    me = f"{os.geteuid()}:{os.getegid()}"
    where = f"{base}: owner {st.st_uid}:{st.st_gid}, mode {stat.S_IMODE(st.st_mode):o}"
    if not os.access(base, os.W_OK | os.X_OK):
        return Check(name, "FAIL", f"{where}; {me} cannot create work dirs in it")
    socket_length = len(os.fsencode(os.path.abspath(base))) + SOCKET_SUFFIX_BYTES
    if socket_length > MAX_SOCKET_PATH_BYTES:
        return Check(
            name,
            "FAIL",
            f"{where}; its bridge sockets would be {socket_length} bytes, over {MAX_SOCKET_PATH_BYTES}",
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return Check(name, "warn", f"{where}; world-writable without the sticky bit")
    return Check(name, "ok", f"{where}; {me} can create work dirs")


def check_cpu_run(api: APIClient, image: str, base: str) -> Check:
    """The launcher's --version in a container made the way the shim makes a job's."""
    from hypha.accelerate_executor.shim.container_spec import ContainerSpec, default_shm_size
    from hypha.accelerate_executor.shim.engine import remove_container
    from hypha.accelerate_executor.shim.mount_source import host_path

    user = f"{os.geteuid()}:{os.getegid()}"
    with tempfile.TemporaryDirectory(prefix="hypha-doctor-", dir=base) as work_dir:
        spec = ContainerSpec(
            image=image,
            command=["--version"],
            user=user,
            work_dir=work_dir,
            work_dir_source=host_path(api, work_dir),
            shm_size=default_shm_size("cpu"),
        )
        start = time.monotonic()
        container = api.create_container(**spec.create_kwargs(api))["Id"]
        try:
            api.start(container)
            code = api.wait(container, timeout=120)["StatusCode"]
            output = api.logs(container).decode("utf-8", "replace").strip()
        finally:
            remove_container(api, container)
    took = time.monotonic() - start
    if code != 0 or __version__ not in output:
        last = (output.splitlines() or ["no output"])[-1]
        return Check("cpu run", "FAIL", f"exit {code}: {last}")
    return Check(
        "cpu run", "ok", f"{output} in {took:.1f} s as {user}, read-only, no network, no caps"
    )


def check_arch_host() -> Check:
    from hypha.accelerate_executor.platform.arch import host_arch
    from hypha.accelerate_executor.platform.variants import BUILDS

    arch = host_arch()
    built = [name for name, a in BUILDS if a == arch]
    return Check("architecture", "ok", f"{arch}: variants built for it: {', '.join(built)}")


def run_checks(
    base: str, cpu_image_tag: str | None = None, registry: str | None = None
) -> list[Check]:
    from hypha.accelerate_executor.shim.engine import connect

    work_dir_base = _checked("work dir base", lambda: check_work_dir_base(base))
    host = [_checked("architecture", check_arch_host), *host_checks(read_host(os.environ))]
    try:
        api = connect()
    except ShimError as exc:
        skipped = Check("cpu run", "skipped", "needs the Docker engine")
        return [*host, Check("docker engine", "FAIL", str(exc)), work_dir_base, skipped]
    prefix = f"{registry.rstrip('/')}/" if registry else ""
    tags: dict[str, tuple[str, ...]] = {
        v: tuple(prefix + t for t in image_tags(v)) for v in CONTAINER_VARIANTS
    }
    if cpu_image_tag:
        tags["cpu"] = (cpu_image_tag,)
    images = [
        _checked(
            f"image {v}",
            partial(check_image, api, v, tags[v], None if cpu_image_tag else registry),
        )
        for v in CONTAINER_VARIANTS
    ]
    checks = [
        *host,
        _checked("docker engine", lambda: check_engine(api)),
        *images,
        _checked("nvidia runtime", lambda: check_nvidia(api)),
        _checked("rocm devices", check_rocm),
        work_dir_base,
    ]
    cpu_image = images[CONTAINER_VARIANTS.index("cpu")]
    if cpu_image.ok and work_dir_base.status in ("ok", "warn"):
        tag = cpu_image.detail.split(" ")[0]
        checks.append(_checked("cpu run", lambda: check_cpu_run(api, tag, base)))
    else:
        checks.append(Check("cpu run", "skipped", "needs the cpu image and a usable work dir base"))
    return checks


def selftest_command(checks: list[Check]) -> str:
    """The `selftest` run that proves this host: in the image of the GPU it has, with the
    flags that hand the GPUs in, else in the cpu image."""
    found = {c.name: c for c in checks}

    def image(variant: str) -> str | None:
        check = found.get(f"image {variant}")
        return check.detail.split(" ")[0] if check is not None and check.ok else None

    runtime = found.get("nvidia runtime")
    if runtime is not None and runtime.ok and found.get("nvidia driver", runtime).ok:
        for variant in NVIDIA_VARIANTS:
            if tag := image(variant):
                return f"docker run --rm --gpus all {tag} selftest"
    rocm = found.get("rocm devices")
    if rocm is not None and rocm.ok and (tag := image("rocm64")):
        return f"docker run --rm --device /dev/kfd --device /dev/dri {tag} selftest"
    return f"docker run --rm {image('cpu')} selftest"


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    return "\n".join(f"  {c.name:<{width}}  {c.status:<7}  {c.detail}" for c in checks)


def main(argv: list[str]) -> int:
    p = OneLineArgumentParser(prog=PROG, description="Check that this host can run the executor.")
    p.add_argument(
        "--work-dir-base",
        default=tempfile.gettempdir(),
        metavar="DIR",
        help="where the worker makes job work dirs (default: the temp dir)",
    )
    p.add_argument(
        "--image",
        metavar="IMG",
        help=f"the cpu image to check and run (default: {' or '.join(image_tags('cpu'))})",
    )
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT][/PATH]",
        help="check the images `hypha-accelerate publish` pushed there (pulls the cpu one)",
    )
    return run_main(PROG, lambda: _check(p.parse_args(argv)))


def _check(args: argparse.Namespace) -> int:
    checks = run_checks(args.work_dir_base, args.image, args.registry)
    print(f"{PROG} {__version__}\n{table(checks)}")
    if checks[-1].ok:
        present = [
            c.name.removeprefix("image ") for c in checks if c.name.startswith("image ") and c.ok
        ]
        print(f"next: train on this host's accelerators and measure it: {selftest_command(checks)}")
        print(f"verdict: the cpu path works; images here: {', '.join(present)}")
        return EXIT_OK
    print("verdict: the cpu path does not work here (see above)")
    return EXIT_FAILED
