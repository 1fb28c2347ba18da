"""`hypha-accelerate build`: build the executor image of a variant, or the mps-host bundle.

    hypha-accelerate build [VARIANT|all] [--arch amd64|arm64] [--offline] [--base-image IMG]
                           [--wheelhouse DIR] [--tag NAME:TAG ...] [--requirements NAME]
                           [--output DIR]

Images are built from a checkout's docker/Dockerfile through docker-py, i.e. the engine's
classic builder API. That path works the same against any engine and whichever docker CLI
is on PATH (here the 28.x CLI has no buildx and the 20.10 one needs DOCKER_BUILDKIT=1), and
it streams JSON whose "Step N/M" records make a condensed progress display; the whole
output goes to a log file that a failure names. The Dockerfile is plain multi-stage, so
BuildKit builds it too (`DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile .`).

`--offline` builds with no network: the base image made by docker/make-base-image.sh and
a wheelhouse made by docker/make-wheelhouse.sh (each made here when missing).

`--arch` builds the variant's row of that architecture in the variants table (default: this
host's). Another architecture than the host's builds under QEMU user emulation
(qemu-user-static, binfmt-support), from its own base image and wheelhouse, and is tagged
with the architecture (hypha-accelerate-executor:cpu-arm64 on an amd64 host).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_OK, BuildError, DockerError, ShimError
from hypha.accelerate_executor.platform.arch import host_arch
from hypha.accelerate_executor.platform.image_tags import (
    CONTAINER_VARIANTS,
    HOST_VARIANT,
    image_tags,
)
from hypha.accelerate_executor.platform.variants import (
    ARCHES,
    BUILDS,
    Arch,
    Variant,
    architectures,
    requirement_lines,
)

if TYPE_CHECKING:
    from docker import APIClient

PROG = "hypha-accelerate build"
OFFLINE_BASE_IMAGE = "hypha-accelerate-base:bookworm"
# docker/make-base-image.sh's image per architecture.
OFFLINE_BASE_IMAGES: dict[Arch, str] = {
    "amd64": OFFLINE_BASE_IMAGE,
    "arm64": f"{OFFLINE_BASE_IMAGE}-arm64",
}
DOCKERFILE = "docker/Dockerfile"
# A build step may stay silent for minutes (pip installing torch): no HTTP read timeout.
BUILD_TIMEOUT_S = 4 * 3600
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
PIN = re.compile(r"(?P<name>[A-Za-z0-9._-]+)===?(?P<version>[^=,]+)")


@dataclass(frozen=True)
class ImageBuild:
    """One image build: what goes into `docker build`."""

    row: Variant
    tags: tuple[str, ...]
    base_image: str | None
    wheelhouse: str | None  # relative to the context root
    requirements: str | None  # file name under docker/requirements/
    torch_version: str
    revision: str

    @property
    def variant(self) -> str:
        return self.row.name

    @property
    def platform(self) -> str:
        return f"linux/{self.row.arch}"

    def buildargs(self) -> dict[str, str]:
        args = {
            "VARIANT": self.variant,
            "VERSION": __version__,
            "SOURCE_REVISION": self.revision,
            "TORCH_VERSION": self.torch_version,
            "TORCH_INDEX_URL": self.row.index or "",
        }
        if self.base_image:
            args["BASE_IMAGE"] = self.base_image
        if self.wheelhouse:
            args["WHEELHOUSE"] = self.wheelhouse
        if self.requirements:
            args["REQUIREMENTS"] = self.requirements
        return args


def project_root() -> Path:
    """The checkout holding docker/Dockerfile: this file's, else the working directory's."""
    for candidate in (Path(__file__).resolve().parents[5], Path.cwd(), *Path.cwd().parents):
        if (candidate / DOCKERFILE).is_file():
            return candidate
    raise ShimError(
        "no docker/Dockerfile here: run `hypha-accelerate build` inside a checkout of the project"
    )


def torch_pin(root: Path, requirements: str) -> str:
    """The torch version (without local label) a requirements file pins with `==` or, to
    refuse local builds, `===`; the image's label states it and its build checks it."""
    path = root / "docker" / "requirements" / requirements
    if not path.is_file():
        raise ShimError(f"no requirements file docker/requirements/{requirements}")
    for line in requirement_lines(path):
        found = re.fullmatch(r"torch===?([^+;\s]+)(\+\S+)?", line)
        if found:
            return found.group(1)
    raise ShimError(f"docker/requirements/{requirements} pins no torch version (torch==X)")


def source_revision(root: Path) -> str:
    """The checkout's commit, marked -dirty when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def run_script(root: Path, script: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Runs one of docker/'s helper scripts, its output going straight to ours."""
    shown = "".join(f"{k}={v} " for k, v in (env or {}).items())
    print(f"running {shown}docker/{script} {' '.join(args)}".rstrip(), flush=True)
    command = ["sh", str(root / "docker" / script), *args]
    if subprocess.run(command, env={**os.environ, **(env or {})}).returncode != 0:
        raise BuildError(
            f"docker/{script} {' '.join(args)} failed (its message is above)",
        )


def ensure_base_image(api: APIClient, root: Path, image: str, arch: Arch) -> None:
    from docker.errors import ImageNotFound

    try:
        inspected = api.inspect_image(image)
    except ImageNotFound:
        if image != OFFLINE_BASE_IMAGES[arch]:
            raise DockerError(
                f"base image {image} not found on the Docker engine",
            ) from None
        run_script(root, "make-base-image.sh", image, env={"ARCH": arch})
        return
    if inspected.get("Architecture") != arch:
        raise DockerError(
            f"base image {image} is {inspected.get('Architecture')}, the build is for {arch}"
        )


def ensure_wheelhouse(root: Path, given: str | None, variant: str, requirements: str | None) -> str:
    """The wheelhouse as a path relative to the context root, made when the default one is missing."""
    if given is not None:
        path = Path(given).resolve()
        if not path.is_relative_to(root):
            raise ShimError(f"wheelhouse {given} must lie inside the build context {root}")
        if not any(path.glob("*.whl")):
            raise ShimError(
                f"wheelhouse {given} holds no wheels (make one with docker/make-wheelhouse.sh)"
            )
        return path.relative_to(root).as_posix()
    name = (requirements or f"{variant}.txt").removesuffix(".txt")
    path = root / "docker" / "wheelhouse" / name
    files = root / "docker" / "requirements"
    # A wheelhouse made before a pin was added or moved lacks its wheel: pip fills it in.
    if missing_wheels(path, [files / f"{name}.txt", files / "cluster.txt"]):
        run_script(root, "make-wheelhouse.sh", name)
    return path.relative_to(root).as_posix()


def _distribution(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_wheels(wheelhouse: Path, requirements: list[Path]) -> list[str]:
    """The `name==version` pins of `requirements` that no wheel in `wheelhouse` provides."""
    present = set()
    for wheel in wheelhouse.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        present.add((_distribution(name), version))
    pins = (
        line.split(";")[0].replace(" ", "") for f in requirements for line in requirement_lines(f)
    )
    return [
        pin
        for pin in pins
        if (m := PIN.fullmatch(pin)) and (_distribution(m["name"]), m["version"]) not in present
    ]


def build_context(root: Path, wheelhouse: str | None) -> IO[bytes]:
    """The context tar: what .dockerignore lets through, less every wheelhouse but the
    chosen one (each is hundreds of MB and the classic builder uploads all it is given)."""
    from docker.utils.build import tar

    patterns = [
        line.strip()
        for line in (root / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    houses = root / "docker" / "wheelhouse"
    if houses.is_dir():
        patterns += [
            p.relative_to(root).as_posix()
            for p in houses.iterdir()
            if p.relative_to(root).as_posix() != wheelhouse
        ]
    context: IO[bytes] = tar(str(root), exclude=patterns, dockerfile=(DOCKERFILE, None))
    return context


class BuildLog:
    """Condenses the builder's stream to its step lines; keeps all of it in a log file."""

    def __init__(self, variant: str, log: IO[str]) -> None:
        self.variant = variant
        self.log = log
        self.started = time.monotonic()
        self.step = "before the first step"
        self.errors: dict[str, str] = {}  # "ERROR:" (pip's verdict) / "error:" -> last such line

    def feed(self, events: Iterable[dict[str, Any]]) -> None:
        for event in events:
            if "error" in event:
                self.fail(str(event["error"]).strip())
            text = str(event.get("stream", ""))
            self.log.write(text)
            for line in text.splitlines():
                self._line(line.rstrip())

    def _line(self, line: str) -> None:
        if line.startswith("Step "):
            self.step = line.removeprefix("Step ").replace(" : ", ": ", 1)
            elapsed = time.monotonic() - self.started
            shown = self.step if len(self.step) <= 110 else self.step[:107] + "..."
            print(f"build {self.variant} [{elapsed:6.1f}s] step {shown}", flush=True)
        else:
            # The classic builder colours a step's stderr; pip's verdict starts "ERROR:".
            plain = ANSI_ESCAPE.sub("", line).strip()
            for prefix in ("ERROR:", "E: ", "error:"):
                if plain.startswith(prefix):
                    self.errors[prefix] = plain

    def fail(self, error: str) -> NoReturn:
        self.log.write(f"\nERROR: {error}\n")
        self.log.flush()
        last = self.errors.get("ERROR:") or self.errors.get("E: ") or self.errors.get("error:")
        hint = f"; last error output: {last}" if last and last not in error else ""
        step = self.step.split(": ", 1)[0]
        # The builder repeats the whole RUN line; the step number names it already.
        error = re.sub(r"^The command '.*' returned", "the command returned", error, flags=re.S)
        raise BuildError(
            f"build of {self.variant} failed at step {step}: {error}{hint} (full log: {self.log.name})",
        )


def image_ids(api: APIClient, names: tuple[str, ...]) -> set[str]:
    """The images these tags name now (those that exist)."""
    from docker.errors import ImageNotFound

    ids = set()
    for name in names:
        with contextlib.suppress(ImageNotFound):
            ids.add(api.inspect_image(name)["Id"])
    return ids


def remove_replaced(api: APIClient, replaced: set[str]) -> None:
    """Remove the images a rebuild took the tags from, where nothing else holds them.

    A rebuilt tag leaves its old image untagged, a gigabyte each: a worker that rebuilds on every
    upgrade (or a CI machine on every run) would fill its disk. The engine refuses to remove an
    image that another tag or a container still uses, and that refusal is the answer: keep it.
    """
    from docker.errors import APIError

    for image_id in replaced:
        try:
            api.remove_image(image_id)
        except APIError:
            continue
        print(
            f"build: removed {image_id[:19]}, the image the rebuilt tags named before", flush=True
        )


def build_image(api: APIClient, root: Path, spec: ImageBuild) -> None:
    from docker.errors import APIError, DockerException
    from requests.exceptions import RequestException

    from hypha.accelerate_executor.shim.engine import root_cause

    print(
        f"build {spec.variant} ({spec.platform}): base {spec.base_image or 'python:3.11-slim-bookworm (default)'}, "
        + (f"offline from {spec.wheelhouse}" if spec.wheelhouse else "online package indexes"),
        flush=True,
    )
    replaced = image_ids(api, spec.tags)
    with tempfile.NamedTemporaryFile(
        "w", prefix=f"hypha-build-{spec.variant}-", suffix=".log", delete=False
    ) as log:
        progress = BuildLog(spec.variant, log)
        context = build_context(root, spec.wheelhouse)
        # Only another architecture than the host's names a platform: a native build stays
        # exactly what it was on engines that handle the parameter differently.
        cross = spec.row.arch != host_arch()
        try:
            events = api.build(
                fileobj=context,
                platform=spec.platform if cross else None,
                custom_context=True,
                dockerfile=DOCKERFILE,
                tag=spec.tags[0],
                buildargs=spec.buildargs(),
                target="runtime",  # later stages are the local cluster's, not the executor's
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                timeout=BUILD_TIMEOUT_S,
            )
            progress.feed(events)
            for name in spec.tags[1:]:
                repository, _, tag = name.rpartition(":")
                api.tag(spec.tags[0], repository, tag)
        except APIError as exc:
            progress.fail(str(exc.explanation or exc))
        except (DockerException, RequestException) as exc:
            raise DockerError(
                f"build of {spec.variant}: lost the Docker engine: {root_cause(exc)}",
            ) from None
        finally:
            context.close()
    built = api.inspect_image(spec.tags[0])
    if built.get("Architecture") != spec.row.arch:
        raise BuildError(
            f"build of {spec.variant} for {spec.platform} made a {built.get('Architecture')} "
            "image: the engine ignored the platform"
        )
    size = int(built["Size"])
    remove_replaced(api, replaced - {built["Id"]})
    elapsed = time.monotonic() - progress.started
    print(
        f"build {spec.variant}: done in {elapsed:.0f}s, {size / 1e9:.2f} GB: {', '.join(spec.tags)}",
        flush=True,
    )
    Path(log.name).unlink()


def build_bundle(root: Path, output: Path, offline: bool, wheelhouse: str | None) -> None:
    """The mps-host bundle: Docker on macOS cannot reach Metal, so the shim runs the
    executor natively from this folder (project wheel, pinned requirements, mps config and
    a launcher script that makes its venv on first use)."""
    print(f"build {HOST_VARIANT}: bundle in {output}", flush=True)
    if output.exists():
        shutil.rmtree(output)
    (output / "accelerate-configs").mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(output)]
    if offline:
        pip += [
            "--no-index",
            "--find-links",
            str(root / ensure_wheelhouse(root, wheelhouse, "cpu", None)),
        ]
    done = subprocess.run([*pip, str(root)], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip gave no message"])[-1]
        raise BuildError(f"building the project wheel for {HOST_VARIANT} failed: {last}")
    pins = list(requirement_lines(root / "docker" / "requirements" / "mps.txt"))
    (output / "requirements.txt").write_text(
        "# Pinned for macOS arm64 (CPython 3.11), from docker/requirements/mps.txt.\n"
        + "\n".join(pins)
        + "\n"
    )
    shutil.copy(root / "accelerate-configs" / "mps.yaml", output / "accelerate-configs")
    script = output / "hypha-accelerate-mps"
    shutil.copy(root / "docker" / "mps-host-launcher.sh", script)
    script.chmod(0o755)
    print(f"build {HOST_VARIANT}: done: {output}", flush=True)


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG,
        description="Build the executor image of a variant (or all), or the mps-host bundle.",
    )
    p.add_argument(
        "variant",
        nargs="?",
        default="cpu",
        choices=[*CONTAINER_VARIANTS, HOST_VARIANT, "all"],
        help="default cpu; all = every container variant and the mps-host bundle",
    )
    p.add_argument(
        "--arch",
        choices=ARCHES,
        help="the CPU architecture to build for (default: this host's; another one builds "
        "under QEMU emulation)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help=f"no network: base image {OFFLINE_BASE_IMAGE} and a wheelhouse (made when missing)",
    )
    p.add_argument("--base-image", metavar="IMG", help="base image (Debian with Python 3.11)")
    p.add_argument(
        "--wheelhouse",
        metavar="DIR",
        help="wheel folder inside the checkout; implies --offline "
        "(default with --offline: docker/wheelhouse/VARIANT)",
    )
    p.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="NAME:TAG",
        help=f"tag(s) instead of {image_tags('VARIANT')[0]} and {image_tags('VARIANT')[1]}",
    )
    p.add_argument(
        "--requirements",
        metavar="NAME",
        help="a file under docker/requirements/ instead of VARIANT.txt (CI stand-ins; needs --tag)",
    )
    p.add_argument(
        "--output",
        metavar="DIR",
        help=f"{HOST_VARIANT} bundle folder (default dist/hypha-accelerate-{HOST_VARIANT}-{__version__})",
    )
    return p


def main(argv: list[str]) -> int:
    def body() -> int:
        args = parser().parse_args(argv)
        arch: Arch = args.arch or host_arch()
        built_here = [v for v in CONTAINER_VARIANTS if (v, arch) in BUILDS]
        variants = [*built_here, HOST_VARIANT] if args.variant == "all" else [args.variant]
        if args.requirements and not args.tag:
            raise ShimError("--requirements builds a non-release image: name it with --tag")
        if len(variants) > 1 and (args.tag or args.requirements):
            raise ShimError("--tag and --requirements apply to one variant, not all")
        offline = args.offline or args.wheelhouse is not None
        root = project_root()
        revision = source_revision(root)
        api = None
        for variant in variants:
            if variant == HOST_VARIANT:
                default = root / "dist" / f"hypha-accelerate-{HOST_VARIANT}-{__version__}"
                build_bundle(
                    root, Path(args.output) if args.output else default, offline, args.wheelhouse
                )
                continue
            row = BUILDS.get((variant, arch))
            if row is None:
                raise ShimError(
                    f"{variant} has no {arch} build (it is built for "
                    f"{', '.join(architectures(variant))})"
                )
            if api is None:
                from hypha.accelerate_executor.shim.engine import connect

                api = connect()
            # The arm64 rows name their own file; amd64's is VARIANT.txt, the default.
            requirements = args.requirements or (
                row.requirements if row.requirements != f"{variant}.txt" else None
            )
            # Checked first: a bad requirements file should not cost a wheelhouse.
            torch_version = torch_pin(root, requirements or row.requirements)
            if not args.requirements and torch_version != row.torch:
                raise ShimError(
                    f"docker/requirements/{row.requirements} pins torch "
                    f"{torch_version}, the variants table {row.torch}: make them agree"
                )
            base = args.base_image or (OFFLINE_BASE_IMAGES[arch] if offline else None)
            if base and offline:
                ensure_base_image(api, root, base, arch)
            spec = ImageBuild(
                row=row,
                tags=tuple(args.tag) or image_tags(variant, arch),
                base_image=base,
                wheelhouse=ensure_wheelhouse(root, args.wheelhouse, variant, requirements)
                if offline
                else None,
                # Only a file the user names: the Dockerfile picks VARIANT-ARCH.txt itself, as
                # for compose, whose builds then share the venv's layer with this one.
                requirements=args.requirements,
                torch_version=torch_version,
                revision=revision,
            )
            build_image(api, root, spec)
        return EXIT_OK

    return run_main(PROG, body)
