"""The release workflow (.github/workflows/release.yml) stays in step with the variants table
and with `hypha-accelerate build` and `publish`: it builds every (variant, architecture) row,
and its commands are ones those parsers accept."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml

from hypha.accelerate_executor.platform.variants import BUILDS, CONTAINER_VARIANTS
from hypha.accelerate_executor.tools import publish
from hypha.accelerate_executor.tools.builder import command as build
from repo_paths import REPO

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def commands(job: dict[str, Any], matrix: dict[str, str]) -> list[list[str]]:
    """The `hypha-accelerate` command lines of a job's run steps, matrix values filled in."""
    found = []
    for step in job["steps"]:
        line = step.get("run", "")
        for key, value in matrix.items():
            line = line.replace(f"${{{{ matrix.{key} }}}}", value)
        words = shlex.split(line.replace('"$REGISTRY"', "registry.example:5000/hypha"))
        if words[:1] == ["hypha-accelerate"]:
            found.append(words[1:])
    return found


def test_the_matrix_is_every_row_of_the_variants_table(workflow: dict[str, Any]) -> None:
    include = workflow["jobs"]["image"]["strategy"]["matrix"]["include"]
    assert sorted((row["variant"], row["arch"]) for row in include) == sorted(BUILDS)


def test_each_image_job_builds_and_pushes_its_row_with_the_commands_parsers(
    workflow: dict[str, Any],
) -> None:
    job = workflow["jobs"]["image"]
    for row in job["strategy"]["matrix"]["include"]:
        (built, pushed) = commands(job, row)
        args = build.parser().parse_args(built[1:])
        assert (built[0], args.variant, args.arch) == ("build", row["variant"], row["arch"])
        args = publish.parser().parse_args(pushed[1:])
        assert (args.variants, args.arch, args.only) == ([row["variant"]], [row["arch"]], "push")


def test_the_last_job_tags_every_variant_after_every_image(workflow: dict[str, Any]) -> None:
    job = workflow["jobs"]["tags"]
    assert job["needs"] == "image"
    ((name, *rest),) = commands(job, {})
    args = publish.parser().parse_args(rest)
    assert name == "publish" and args.only == "lists"
    assert sorted(args.variants) == sorted(CONTAINER_VARIANTS)


def test_the_registry_and_its_login_are_settings_not_values(workflow: dict[str, Any]) -> None:
    assert workflow["env"]["REGISTRY"] == "${{ vars.IMAGE_REGISTRY }}"
    for job in workflow["jobs"].values():
        (login,) = (s for s in job["steps"] if str(s.get("uses", "")).startswith("docker/login"))
        assert login["with"]["password"] == "${{ secrets.REGISTRY_PASSWORD }}"


def test_a_job_that_builds_installs_the_checkout_editable(workflow: dict[str, Any]) -> None:
    """The wheel leaves `build` out: only an editable install of the checkout has it."""
    for name, job in workflow["jobs"].items():
        runs = [step.get("run", "") for step in job["steps"]]
        builds = [i for i, run in enumerate(runs) if run.startswith("hypha-accelerate build")]
        installs = [i for i, run in enumerate(runs) if run.startswith("pip install -e ")]
        assert not builds or (installs and installs[0] < builds[0]), name
