"""`hypha-accelerate publish`: push built variants to a registry as multi-architecture tags.

    hypha-accelerate publish VARIANT... --registry HOST[:PORT][/PATH] [--arch A ...]
                             [--from ARCH=IMAGE ...] [--only push|lists] [--insecure]

For each variant, the image built for each of its architectures (`hypha-accelerate build V
--arch A`, tagged hypha-accelerate-executor:V on its own architecture's host and
...:V-A elsewhere) is pushed as REGISTRY/hypha-accelerate-executor:VERSION-V-A; then one
manifest list per tag, REGISTRY/hypha-accelerate-executor:VERSION-V and :V, names them all,
so that `docker pull` on an amd64 and on an arm64 host each gets its own image. Docker 20.10
has no buildx: the lists are made by the docker CLI's `docker manifest`, which reads the
registry's credentials from `docker login`'s store, so no secret passes through here.
`--insecure` (plain HTTP) is implied for loopback registries, which the engine allows too.

Where each architecture builds on a host of its own (the release workflow,
.github/workflows/release.yml), each pushes its image with `--only push --arch A`, and one
last step makes the lists from what the registry holds with `--only lists`.
"""

from __future__ import annotations

import argparse
import ipaddress
import shutil
import subprocess
from typing import TYPE_CHECKING

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_OK, DockerError, ShimError
from hypha.accelerate_executor.platform.image_tags import CONTAINER_VARIANTS, image_tags
from hypha.accelerate_executor.platform.variants import ARCHES, Arch, architectures

if TYPE_CHECKING:
    from docker import APIClient

PROG = "hypha-accelerate publish"


def registry_host(registry: str) -> str:
    return registry.split("/", 1)[0].rsplit(":", 1)[0]


def is_loopback(registry: str) -> bool:
    host = registry_host(registry)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def remote_tags(registry: str, variant: str) -> tuple[str, str]:
    """The multi-architecture tags: this release's, then the moving one."""
    versioned, moving = image_tags(variant)
    return f"{registry}/{versioned}", f"{registry}/{moving}"


def local_image(api: APIClient, variant: str, arch: Arch, given: str | None) -> str:
    """The built image of `variant` for `arch`, checked to be that architecture's."""
    from docker.errors import ImageNotFound

    candidates = [given] if given else list(image_tags(variant, arch))
    for name in candidates:
        try:
            found = api.inspect_image(name)
        except ImageNotFound:
            continue
        if found.get("Architecture") != arch:
            raise ShimError(f"image {name} is {found.get('Architecture')}, not {arch}")
        return name
    if given:
        raise DockerError(f"image {given} not found on the Docker engine")
    raise DockerError(
        f"no {arch} image of {variant} ({' or '.join(candidates)}); "
        f"build it with `hypha-accelerate build {variant} --arch {arch}`"
    )


def push(api: APIClient, image: str, reference: str) -> str:
    """Tags `image` as `reference`, pushes it, and returns the digest the registry states."""
    from docker.errors import APIError

    repository, _, tag = reference.rpartition(":")
    digest = ""
    try:
        api.tag(image, repository, tag)
        for event in api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise DockerError(f"push of {reference} failed: {event['error']}")
            digest = event.get("aux", {}).get("Digest", digest)
    except APIError as exc:
        raise DockerError(f"push of {reference} failed: {exc.explanation or exc}") from None
    if not digest:
        raise DockerError(f"push of {reference}: the engine stated no digest")
    return digest


def docker_cli(*args: str) -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise DockerError("the docker CLI is not on PATH (publish makes manifest lists with it)")
    done = subprocess.run([docker, *args], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise DockerError(f"docker {args[0]} {args[1]} failed: {last}")
    return done.stdout.strip()


def publish_list(tag: str, references: list[str], insecure: bool) -> str:
    """Makes the manifest list `tag` of the images at `references` in the registry; returns
    its digest."""
    flag = ["--insecure"] if insecure else []
    # --amend: the CLI keeps lists it made locally; a re-publish replaces what it held.
    docker_cli("manifest", "create", "--amend", *flag, tag, *references)
    out = docker_cli("manifest", "push", "--purge", *flag, tag)
    return out.splitlines()[-1] if out else "unknown"


def parse_from(values: list[str]) -> dict[Arch, str]:
    given: dict[Arch, str] = {}
    for value in values:
        arch, sep, image = value.partition("=")
        if not sep or arch not in ARCHES or not image:
            raise ShimError(f"--from {value}: expected ARCH=IMAGE with ARCH one of {ARCHES}")
        given[arch] = image
    return given


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog=PROG,
        description="Push built variants to a registry as multi-architecture tags.",
    )
    p.add_argument("variants", nargs="+", choices=CONTAINER_VARIANTS, metavar="VARIANT")
    p.add_argument("--registry", required=True, help="HOST[:PORT][/PATH] to push to")
    p.add_argument(
        "--arch",
        action="append",
        choices=ARCHES,
        help="only these architectures (default: every one the variant is built for)",
    )
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        metavar="ARCH=IMAGE",
        help="the local image to push for ARCH instead of the variant's tag (one variant only)",
    )
    p.add_argument(
        "--only",
        choices=["push", "lists"],
        help="push: the per-architecture images only; lists: only the multi-architecture "
        "tags, of per-architecture images already in the registry",
    )
    p.add_argument("--insecure", action="store_true", help="plain HTTP (implied on loopback)")
    return p


def main(argv: list[str]) -> int:
    def body() -> int:
        args = parser().parse_args(argv)
        sources = parse_from(args.sources)
        if sources and len(args.variants) > 1:
            raise ShimError("--from names images of one variant: publish one variant with it")
        registry = args.registry.rstrip("/")
        if not registry or "://" in registry:
            raise ShimError(f"--registry {args.registry}: expected HOST[:PORT][/PATH]")
        insecure = args.insecure or is_loopback(registry)
        from hypha.accelerate_executor.shim.engine import connect

        api = connect()
        for variant in args.variants:
            arches = [a for a in architectures(variant) if not args.arch or a in args.arch]
            if not arches:
                raise ShimError(f"{variant} is built for {', '.join(architectures(variant))} only")
            versioned, moving = remote_tags(registry, variant)
            references = [f"{versioned}-{arch}" for arch in arches]
            if args.only != "lists":
                images = [local_image(api, variant, a, sources.get(a)) for a in arches]
                for image, reference in zip(images, references, strict=True):
                    digest = push(api, image, reference)
                    print(f"publish {variant}: {image} -> {reference} ({digest})")
            if args.only != "push":
                for tag in (versioned, moving):
                    digest = publish_list(tag, references, insecure)
                    print(f"publish {variant}: {tag} ({'+'.join(arches)}) {digest}")
        return EXIT_OK

    return run_main(PROG, body)
