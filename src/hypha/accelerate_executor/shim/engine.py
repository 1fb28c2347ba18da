"""Talking to the Docker engine: connecting, finding images, removing containers.

Everything goes through docker-py's low-level `APIClient`: the high-level objects inspect
each container they touch, which costs a round trip per call on the start-up path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.errors import DockerError
from hypha.accelerate_executor.platform.arch import host_arch, image_arch
from hypha.accelerate_executor.platform.image_tags import build_command, image_tags

if TYPE_CHECKING:
    from docker import APIClient
    from docker.errors import APIError


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def connect() -> APIClient:
    """An API client at the engine's own API version (engines here speak 1.41, docker-py
    defaults to a newer one). Calls time out after 60 s; `wait` passes no timeout."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise DockerError(
            "docker-py is not installed: pip install 'hypha-accelerate-executor[shim]'",
        ) from None

    try:
        return docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
    except DockerException as exc:
        raise DockerError(
            f"cannot reach the Docker engine at {engine_address()}: {root_cause(exc)} "
            "(is dockerd running, and may this user use its socket?)",
        ) from None


def root_cause(exc: BaseException) -> str:
    """The innermost error's message: docker-py wraps an ENOENT three levels deep."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def explain(exc: APIError) -> str:
    """The engine's own message for a refused call, without docker-py's URL dump."""
    return str(exc.explanation or exc)


def find_image(api: APIClient, variant: str, override: str | None) -> str:
    """The image to run: `override` if given, else the variant's versioned tag, else its
    moving tag. Names the build command when neither exists; refuses an image built for
    another CPU architecture than the host's."""
    from docker.errors import ImageNotFound

    candidates = [override] if override else list(image_tags(variant))
    for name in candidates:
        try:
            inspected = api.inspect_image(name)
        except ImageNotFound:
            continue
        check_arch(name, inspected)
        return name
    if override:
        raise DockerError(f"image {override} not found on the Docker engine")
    versioned, moving = image_tags(variant)
    raise DockerError(
        f"image {versioned} not found (nor {moving}); build it with `{build_command(variant)}`",
    )


def check_arch(name: str, inspected: dict[str, Any]) -> None:
    """Refuses an image of another architecture: binfmt_misc would run it under QEMU, tens
    of times slower and without the host's GPU libraries."""
    host, image = host_arch(), image_arch(inspected)
    if image != host:
        raise DockerError(
            f"image {name} is built for {image}, this host is {host}: it would run emulated; "
            f"use the variant's {host} image"
        )


def pull_image(api: APIClient, reference: str) -> dict[str, Any]:
    """Pulls `reference` (REPOSITORY:TAG) for this host's architecture; its inspect."""
    from docker.errors import APIError

    repository, _, tag = reference.rpartition(":")
    # stderr: worker-config's stdout is the TOML an operator pastes.
    print(f"pulling {reference} (linux/{host_arch()})", file=sys.stderr, flush=True)
    try:
        for event in api.pull(
            repository, tag=tag, platform=f"linux/{host_arch()}", stream=True, decode=True
        ):
            if "error" in event:
                raise DockerError(f"pull of {reference} failed: {event['error']}")
        return dict(api.inspect_image(reference))
    except APIError as exc:
        raise DockerError(f"pull of {reference} failed: {explain(exc)}") from None


@dataclass(frozen=True)
class RegistryImage:
    """A variant's image from a registry, as this host runs it."""

    tag: str  # REGISTRY/hypha-accelerate-executor:VERSION-VARIANT
    digest: str  # what the tag names in the registry now (for a multi-arch tag, the list)
    inspected: dict[str, Any]  # the local image: Id, Architecture, Size

    @property
    def pinned(self) -> str:
        """The tag's repository at that digest: what the worker runs, whatever the tag does later."""
        return f"{self.tag.rpartition(':')[0]}@{self.digest}"


def registry_image(api: APIClient, registry: str, variant: str) -> RegistryImage:
    """This release's image of `variant` from `registry` (`hypha-accelerate publish`): the
    registry says which digest its tag names; the engine pulls it for this host's
    architecture unless its local image is already that one; it must be this host's."""
    from docker.errors import APIError, ImageNotFound

    tag = f"{registry.rstrip('/')}/{image_tags(variant)[0]}"
    try:
        digest = str(api.inspect_distribution(tag)["Descriptor"]["digest"])
    except APIError as exc:
        raise DockerError(f"registry lookup of {tag} failed: {explain(exc)}") from None
    wanted = RegistryImage(tag, digest, {})
    try:
        inspected = dict(api.inspect_image(tag))
    except ImageNotFound:
        inspected = {}
    if wanted.pinned not in inspected.get("RepoDigests", ()) or (
        image_arch(inspected) != host_arch()
    ):
        inspected = pull_image(api, tag)
    check_arch(tag, inspected)
    return RegistryImage(tag, digest, inspected)


@contextmanager
def gone_counts_as_done() -> Iterator[None]:
    """A container already gone (404), or already being removed or stopped (409), is one the
    call in this block need not act on."""
    from docker.errors import APIError

    try:
        yield
    except APIError as exc:
        if exc.status_code not in (404, 409):
            raise


def remove_container(api: APIClient, container_id: str) -> None:
    """Force-removes a container; one already gone or being removed counts as done."""
    with gone_counts_as_done():
        api.remove_container(container_id, force=True)
