"""`hypha-accelerate publish` against a real registry on loopback (Debian's docker-registry,
the distribution registry), with two small images built here for linux/amd64 and
linux/arm64: one multi-architecture tag that an amd64 and an arm64 pull each resolve to
their own image, which `worker-config --registry` then pins by digest; and the shim's
refusal of an image of another architecture than the host's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.platform.arch import host_arch
from hypha.accelerate_executor.platform.image_tags import image_tags
from hypha.accelerate_executor.platform.launcher.plan import free_port
from shim_harness import WorkerJob, build_small_image, shim_command

pytestmark = pytest.mark.docker

REGISTRY_BINARY = Path("/usr/bin/docker-registry")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A registry on a free loopback port with its storage in tmp_path; its HOST:PORT."""
    if not REGISTRY_BINARY.exists():
        pytest.fail("no docker-registry (apt-get install docker-registry; tests/run.sh does)")
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    process = subprocess.Popen(
        [str(REGISTRY_BINARY), "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("the registry did not come up on loopback")
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def small_images(docker_api: Any) -> Iterator[dict[str, tuple[str, str]]]:
    """arch -> (tag, image id) of a small image per architecture."""
    name = f"hypha-publish-test-{uuid.uuid4().hex[:8]}"
    images = {}
    for arch in ("amd64", "arm64"):
        tag = f"{name}:{arch}"
        images[arch] = (tag, build_small_image(docker_api, arch, tag))
    yield images
    for _, image_id in images.values():
        docker_api.remove_image(image_id, force=True)


def forget(api: Any, *names: str) -> None:
    from docker.errors import ImageNotFound

    for name in names:
        with contextlib.suppress(ImageNotFound):
            api.remove_image(name, force=True)


def hypha(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def manifest_list(reference: str) -> dict[str, str]:
    """arch -> manifest digest, as the registry serves the list (docker manifest inspect)."""
    shown = subprocess.run(
        ["docker", "manifest", "inspect", "--insecure", reference],
        capture_output=True,
        text=True,
        check=True,
    )
    listed = json.loads(shown.stdout)
    assert listed["mediaType"] == "application/vnd.docker.distribution.manifest.list.v2+json"
    return {m["platform"]["architecture"]: m["digest"] for m in listed["manifests"]}


def test_publish_makes_one_tag_that_each_architecture_pulls_as_its_own(
    docker_api: Any, registry: str, small_images: dict[str, tuple[str, str]]
) -> None:
    published = hypha(
        "publish",
        "cpu",
        "--registry",
        registry,
        *(f"--from={arch}={tag}" for arch, (tag, _) in small_images.items()),
    )
    assert published.returncode == 0, published.stderr
    versioned, moving = (f"{registry}/{tag}" for tag in image_tags("cpu"))
    pushed = {}
    for line in published.stdout.splitlines():
        if line.startswith(f"publish cpu: {small_images['amd64'][0].split(':')[0]}"):
            reference, digest = line.split(" -> ")[1].rstrip(")").split(" (")
            pushed[reference.rsplit("-", 1)[1]] = digest
    assert set(pushed) == {"amd64", "arm64"}, published.stdout
    lists = dict(
        line.removeprefix("publish cpu: ").split(" (amd64+arm64) ")
        for line in published.stdout.splitlines()
        if " (amd64+arm64) " in line
    )
    assert set(lists) == {versioned, moving}, published.stdout
    # Both tags are lists of the two images the registry stated on push.
    assert manifest_list(versioned) == pushed
    assert manifest_list(moving) == pushed
    print(f"registry {registry}: {moving} -> {pushed}")

    repository, _, tag = moving.rpartition(":")
    for arch, (_, image_id) in small_images.items():
        docker_api.pull(repository, tag=tag, platform=f"linux/{arch}")
        pulled = docker_api.inspect_image(moving)
        # The very image built here for that architecture (same config, same id).
        assert (pulled["Architecture"], pulled["Id"]) == (arch, image_id)
        print(f"pull --platform linux/{arch}: {pulled['Id']} {pulled['RepoDigests']}")
    forget(docker_api, moving)

    # worker-config pulls what this host runs and pins it by digest in both entries.
    config = hypha("worker-config", "--variant", "cpu", "--registry", registry)
    assert config.returncode == 0, config.stderr
    pinned = docker_api.inspect_image(versioned)
    assert pinned["Id"] == small_images[host_arch()][1]
    # Pinned by the list's digest, the one publish made, which this host resolves to its image.
    reference = f"{versioned.rpartition(':')[0]}@{lists[versioned]}"
    assert reference in pinned["RepoDigests"]
    assert config.stdout.count(f'"{reference}"') == 2, config.stdout
    assert f"linux/{host_arch()} on this host: image id {pinned['Id']}" in config.stdout
    assert f"pulling {versioned}" in config.stderr
    forget(docker_api, versioned, f"{versioned}-amd64", f"{versioned}-arm64")


def test_each_architecture_pushes_on_its_own_and_a_last_step_makes_the_lists(
    docker_api: Any, registry: str, small_images: dict[str, tuple[str, str]]
) -> None:
    # The release workflow's way: one build host per architecture, then one list step.
    pushed = {}
    for arch, (tag, _) in small_images.items():
        result = hypha(
            "publish", "cpu", "--registry", registry, "--only", "push", "--arch", arch,
            "--from", f"{arch}={tag}",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        [line] = result.stdout.splitlines()
        pushed[arch] = line.rpartition(" (")[2].rstrip(")")
    lists = hypha("publish", "cpu", "--registry", registry, "--only", "lists")
    assert lists.returncode == 0, lists.stderr
    versioned, moving = (f"{registry}/{tag}" for tag in image_tags("cpu"))
    assert manifest_list(versioned) == manifest_list(moving) == pushed
    forget(docker_api, f"{versioned}-amd64", f"{versioned}-arm64")


def test_lists_of_images_the_registry_lacks_are_refused_in_one_line(registry: str) -> None:
    result = hypha("publish", "cu130", "--registry", registry, "--only", "lists")
    assert result.returncode == 125
    [line] = result.stderr.splitlines()
    assert line.startswith("hypha-accelerate publish: docker manifest create failed: "), line


def test_publish_names_the_build_of_a_missing_architecture(
    docker_api: Any, registry: str, small_images: dict[str, tuple[str, str]]
) -> None:
    result = hypha(
        "publish", "cpu", "--registry", registry, "--from", f"amd64={small_images['arm64'][0]}"
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hypha-accelerate publish: image {small_images['arm64'][0]} is arm64, not amd64"
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["cpu", "--registry", "http://127.0.0.1:5000"], "expected HOST[:PORT][/PATH]"),
        (["cpu", "--registry", "r", "--from", "s390x=x"], "expected ARCH=IMAGE"),
        (["cpu", "cu130", "--registry", "r", "--from", "amd64=x"], "publish one variant"),
        (["cu126", "--registry", "r", "--arch", "arm64"], "cu126 is built for amd64 only"),
    ],
)
def test_publish_refuses_bad_arguments_in_one_line(args: list[str], words: str) -> None:
    result = hypha("publish", *args)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("hypha-accelerate publish: ") and words in line, line


def test_the_shim_refuses_an_image_of_another_architecture_in_one_line(
    docker_api: Any, worker_job: WorkerJob, small_images: dict[str, tuple[str, str]]
) -> None:
    other = "arm64" if host_arch() == "amd64" else "amd64"
    tag = small_images[other][0]
    result = subprocess.run(
        shim_command(*worker_job.run_args(image=tag)), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 125
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"hypha-accelerate run: image {tag} is built for {other}, this host is {host_arch()}: "
        f"it would run emulated; use the variant's {host_arch()} image"
    ]
    # No container was made of it.
    assert docker_api.containers(all=True, filters={"ancestor": tag}) == []


def test_doctor_fails_the_image_row_of_another_architecture(
    small_images: dict[str, tuple[str, str]],
) -> None:
    other = "arm64" if host_arch() == "amd64" else "amd64"
    result = hypha("doctor", "--image", small_images[other][0])
    assert result.returncode == 1
    rows = {
        " ".join(line.split()[:2]): line.split()[2:]
        for line in result.stdout.splitlines()
        if line.startswith("  ")
    }
    assert rows["architecture ok"][0] == f"{host_arch()}:"
    assert rows["image cpu"][0] == "FAIL"
    assert " ".join(rows["image cpu"][1:]).startswith(
        f"image {small_images[other][0]} is built for {other}, this host is {host_arch()}"
    )
