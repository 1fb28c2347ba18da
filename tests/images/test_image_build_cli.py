"""`hypha-accelerate build`'s mistakes a user can make: one line on stderr, non-zero exit,
nothing built."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypha.accelerate_executor.errors import ShimError
from hypha.accelerate_executor.tools.builder import command as build
from image_harness import ROOT


def run_build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", "build", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tpu"], "invalid choice: 'tpu'"),
        (["cu126", "--requirements", "ci-standin-cu126.txt"], "name it with --tag"),
        (["all", "--tag", "x:y"], "apply to one variant, not all"),
        (["cpu", "--wheelhouse", "/tmp"], "must lie inside the build context"),
        (["cu128", "--arch", "arm64"], "cu128 has no arm64 build (it is built for amd64)"),
        (
            ["cpu", "--requirements", "nope.txt", "--tag", "x:y", "--offline"],
            "no requirements file",
        ),
    ],
)
def test_bad_arguments_end_in_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run_build(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr


def test_an_unreachable_engine_is_one_line_and_exit_125() -> None:
    result = run_build("cpu", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.returncode == 125
    assert result.stderr.splitlines() == [
        "hypha-accelerate build: cannot reach the Docker engine at unix:///nonexistent/docker.sock: "
        "No such file or directory (is dockerd running, and may this user use its socket?)"
    ]


def test_torch_pin_reads_through_includes() -> None:
    assert build.torch_pin(ROOT, "cu129.txt") == "2.8.0"
    assert "accelerate==1.15.0" in list(
        build.requirement_lines(ROOT / "docker/requirements/cu129.txt")
    )


def test_the_build_log_condenses_the_stream_to_step_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = io.StringIO()
    log.name = "build.log"
    progress = build.BuildLog("cpu", log)
    progress.feed(
        [
            {"stream": "Step 1/3 : FROM base AS wheel\n"},
            {"stream": " ---> a20d3c65b727\n"},
            {"stream": "Step 2/3 : RUN pip install x\n"},
            {"stream": " ---> Running in 1234\n"},
            {
                "stream": "Collecting x\n\x1b[91mERROR: No matching distribution found for x\n\x1b[0m"
            },
        ]
    )
    shown = capsys.readouterr().out.splitlines()
    assert [line.split("] ", 1)[1] for line in shown] == [
        "step 1/3: FROM base AS wheel",
        "step 2/3: RUN pip install x",
    ]
    with pytest.raises(ShimError) as failed:
        progress.feed(
            [{"error": "The command '/bin/sh -c pip install x' returned a non-zero code: 1"}]
        )
    assert str(failed.value) == (
        "build of cpu failed at step 2/3: the command returned a non-zero code: 1; "
        "last error output: ERROR: No matching distribution found for x (full log: build.log)"
    )
    assert "Collecting x" in log.getvalue()


def test_the_cluster_packages_make_no_wheelhouse_of_their_own() -> None:
    # compose.yaml's one wheelhouse is a variant's: cluster.txt goes into every one.
    result = subprocess.run(
        ["sh", str(ROOT / "docker" / "make-wheelhouse.sh"), "cluster"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "make-wheelhouse: cluster.txt goes into every variant's wheelhouse; "
        "name a variant (cpu, cu130, ...)"
    ]


def test_a_wheelhouse_that_lacks_a_pinned_wheel_is_filled_in(tmp_path: Path) -> None:
    """A wheelhouse made before a pin was added or moved: `build --offline` runs
    make-wheelhouse.sh again, which pip fills in, rather than failing inside the image build."""
    folder = tmp_path
    (folder / "common.txt").write_text("opentelemetry-sdk==1.45.2\nDocker_Py===7.2.0\n# a note\n")
    (folder / "cpu.txt").write_text("-r common.txt\ntorch==2.13.0+cpu\n")
    house = folder / "wheels"
    house.mkdir()
    for name in (
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        "docker_py-7.2.0-py3-none-any.whl",
    ):
        (house / name).touch()
    assert build.missing_wheels(house, [folder / "cpu.txt"]) == ["opentelemetry-sdk==1.45.2"]
    (house / "opentelemetry_sdk-1.45.2-py3-none-any.whl").touch()
    assert build.missing_wheels(house, [folder / "cpu.txt"]) == []
    (folder / "common.txt").write_text("opentelemetry-sdk==1.46.0\n")
    assert build.missing_wheels(house, [folder / "cpu.txt"]) == ["opentelemetry-sdk==1.46.0"]
