"""Architecture names: uname's machine to Docker's, and the tags an image of each carries."""

from __future__ import annotations

import pytest

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.platform.arch import UnknownArchitecture, arch_of_machine, host_arch
from hypha.accelerate_executor.platform.image_tags import image_tags
from hypha.accelerate_executor.platform.variants import BUILDS, CONTAINER_VARIANTS, architectures


@pytest.mark.parametrize(
    ("machine", "arch"),
    [("x86_64", "amd64"), ("AMD64", "amd64"), ("aarch64", "arm64"), ("arm64", "arm64")],
)
def test_machines_map_to_dockers_names(machine: str, arch: str) -> None:
    assert arch_of_machine(machine) == arch


def test_an_architecture_without_images_is_refused_by_name() -> None:
    with pytest.raises(UnknownArchitecture, match="'s390x' has no images"):
        arch_of_machine("s390x")


def test_the_hosts_image_keeps_the_plain_tags_another_architectures_says_so() -> None:
    other = "arm64" if host_arch() == "amd64" else "amd64"
    assert image_tags("cpu", host_arch()) == image_tags("cpu")
    assert image_tags("cpu", other) == (
        f"hypha-accelerate-executor:{__version__}-cpu-{other}",
        f"hypha-accelerate-executor:cpu-{other}",
    )


def test_every_container_variant_has_an_amd64_build_and_cpu_cu130_an_arm64_one() -> None:
    assert {v for v in CONTAINER_VARIANTS if "amd64" in architectures(v)} == set(CONTAINER_VARIANTS)
    assert {name for name, arch in BUILDS if arch == "arm64"} == {"cpu", "cu130"}


def test_worker_config_refuses_a_variant_without_an_image_for_the_host() -> None:
    import subprocess
    import sys

    # cu128 has an amd64 row only: on an arm64 host there is no image to name.
    code = (
        "import platform, sys; platform.machine = lambda: 'aarch64'; "
        "from hypha.accelerate_executor.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "worker-config", "--variant", "cu128"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "hypha-accelerate worker-config: cu128 has no arm64 image; this host's variants: cpu, cu130"
    ]
