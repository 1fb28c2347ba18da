"""A rebuild removes the image its tags named before, unless something still holds that image:
without it every `hypha-accelerate build` of an existing tag leaves a gigabyte behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from docker.errors import ImageNotFound

from hypha.accelerate_executor.platform.arch import host_arch
from hypha.accelerate_executor.tools.builder.command import image_ids, remove_replaced
from shim_harness import build_small_image

pytestmark = pytest.mark.docker


def exists(api: Any, image_id: str) -> bool:
    try:
        api.inspect_image(image_id)
    except ImageNotFound:
        return False
    return True


def test_the_replaced_image_goes_and_one_a_container_holds_stays(docker_api: Any) -> None:
    tag = f"hypha-build-replaces-test-{uuid.uuid4().hex[:8]}:x"
    arch = host_arch()
    first = build_small_image(docker_api, arch, tag)
    assert image_ids(docker_api, (tag, f"{tag}-absent")) == {first}
    held = docker_api.create_container(first, command=["/arch"])  # created, never started
    try:
        second = build_small_image(docker_api, arch, tag)
        assert second != first
        remove_replaced(docker_api, {first})
        assert exists(docker_api, first), "the image a container uses must stay"
        docker_api.remove_container(held)
        held = None
        third = build_small_image(docker_api, arch, tag)
        remove_replaced(docker_api, {second} - {third})
        assert not exists(docker_api, second)
        assert exists(docker_api, third)
    finally:
        if held is not None:
            docker_api.remove_container(held)
        for image_id in image_ids(docker_api, (tag,)) | {first}:
            if exists(docker_api, image_id):
                docker_api.remove_image(image_id, force=True)
