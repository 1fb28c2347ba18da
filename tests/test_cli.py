"""The `hypha-accelerate` dispatcher: a sub-command whose module this installation left out
(the runtime image keeps only what selftest needs of the stand-in) ends in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypha.accelerate_executor import cli


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
