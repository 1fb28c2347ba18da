"""Talking to the Docker engine: connecting, finding images, removing containers.

Everything goes through docker-py's low-level `APIClient`: the high-level objects inspect
each container they touch, which costs a round trip per call on the start-up path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from hypha.accelerate_executor.errors import DockerError
from hypha.accelerate_executor.shim.variants import build_command, image_tags

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
    moving tag. Names the build command when neither exists."""
    from docker.errors import ImageNotFound

    candidates = [override] if override else list(image_tags(variant))
    for name in candidates:
        try:
            api.inspect_image(name)
        except ImageNotFound:
            continue
        return name
    if override:
        raise DockerError(f"image {override} not found on the Docker engine")
    versioned, moving = image_tags(variant)
    raise DockerError(
        f"image {versioned} not found (nor {moving}); build it with `{build_command(variant)}`",
    )


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
