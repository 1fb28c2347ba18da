"""The `hypha-accelerate` dispatcher: a sub-command whose module this installation left out
(the runtime image keeps only what selftest needs of the stand-in; the wheel leaves `build`
out) ends in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hypha.accelerate_executor import cli
from repo_paths import REPO

ROOT = REPO


def test_a_command_whose_module_is_not_installed_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.COMMANDS, "local", ("hypha.standin.not_installed", "left out"))
    assert cli.main(["local", "demo"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "hypha-accelerate: 'local' is not installed here (hypha.standin.not_installed is missing)"
    ]


def test_a_missing_import_inside_a_command_still_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only the command's own module counts as not installed; what it imports is not hidden."""
    (tmp_path / "command_with_a_bug.py").write_text("import a_dependency_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "buggy", ("command_with_a_bug", "a bug"))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_nobody_installed"):
        cli.main(["buggy"])


def test_build_works_from_a_checkout_and_an_installed_wheel_says_it_needs_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wheel (what a worker host installs, and every image) leaves the release tool
    `build` out; from a checkout it is there."""
    with pytest.raises(SystemExit) as helped:  # argparse's --help
        cli.main(["build", "--help"])
    assert helped.value.code == 0
    assert "hypha-accelerate build" in capsys.readouterr().out
    # The wheel as the Dockerfile's wheel stage builds it: from a clean copy of the sources.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    wheel_dir, installed = tmp_path / "dist", tmp_path / "installed"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheel_dir), str(source)],
        check=True, timeout=300,
    )  # fmt: skip
    [wheel] = wheel_dir.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hypha/accelerate_executor/tools/doctor.py" in names
    assert not [name for name in names if "/tools/builder" in name]
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(installed), str(wheel)], check=True
    )
    done = subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", "build", "cpu"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(installed)},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"hypha-accelerate: {cli.LEFT_OUT['build']}"]
