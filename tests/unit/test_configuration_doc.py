"""docs/configuration.md names every `HYPHA_*` variable and every flag the project reads.

The variables are found where they are read: string literals (and keyword names) in src/'s
Python that are exactly a `HYPHA_*` name, and `$HYPHA_*` expansions in the shell scripts,
Dockerfile and compose files operators run. The flags are the `--...` names given to
argparse's `add_argument` anywhere in src/.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from repo_paths import REPO

ROOT = REPO
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"HYPHA_[A-Z0-9_]+")
SHELL_EXPANSION = re.compile(r"\$\{?(HYPHA_[A-Z0-9_]+)")
# Scripts and files whose `$HYPHA_*` expansions are settings an operator or a CI run gives.
SCRIPTS = ("docker/*", "compose*.yaml", "tests/run.sh", "bench/gpu_acceptance/*.sh")
FLAG_CELL = re.compile(r"`(--[a-z0-9-]+)")


def _python_sources() -> list[Path]:
    return sorted((ROOT / "src").rglob("*.py"))


def _trees() -> Iterator[tuple[Path, ast.AST]]:
    for path in _python_sources():
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def variables_read() -> dict[str, str]:
    """Each `HYPHA_*` name the project reads, with one place that reads it."""
    found: dict[str, str] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.keyword):
                text = node.arg
            if text and NAME.fullmatch(text):
                found.setdefault(text, str(path.relative_to(ROOT)))
    for pattern in SCRIPTS:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file():
                for name in SHELL_EXPANSION.findall(path.read_text(encoding="utf-8")):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def flags_defined() -> dict[str, str]:
    """Each `--flag` given to argparse in src/, with one module that defines it."""
    found: dict[str, str] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        found.setdefault(str(arg.value), str(path.relative_to(ROOT)))
    return found


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def documented_variables() -> set[str]:
    """The names in the first cell of the environment table's rows."""
    rows = (line for line in _section("Environment variables").splitlines() if line.startswith("|"))
    return {name for row in rows for name in NAME.findall(row.split("|")[1])}


def documented_flags() -> set[str]:
    return set(FLAG_CELL.findall(_section("Flags")))


def test_the_scan_sees_variables_and_flags_the_code_is_known_to_read() -> None:
    # A scan that finds nothing would pass everything below.
    assert {"HYPHA_VARIANT", "HYPHA_TRUST_REMOTE_CODE", "HYPHA_NVIDIA_DRIVER_VERSION_FILE"} <= set(
        variables_read()
    )
    assert {"HYPHA_MPS_VENV", "HYPHA_OFFLINE", "HYPHA_WHEELHOUSE"} <= set(variables_read())
    assert {"--variant", "--bridge-generation", "--linger"} <= set(flags_defined())


def test_every_variable_the_project_reads_has_a_row() -> None:
    missing = {n: where for n, where in variables_read().items() if n not in documented_variables()}
    assert not missing, "docs/configuration.md's environment table lacks: " + ", ".join(
        f"{name} (read in {where})" for name, where in sorted(missing.items())
    )


def test_every_row_names_a_variable_the_project_reads() -> None:
    stale = documented_variables() - set(variables_read())
    assert not stale, f"docs/configuration.md documents variables nothing reads: {sorted(stale)}"


def test_every_flag_is_documented() -> None:
    missing = {f: where for f, where in flags_defined().items() if f not in documented_flags()}
    assert not missing, "docs/configuration.md's flag tables lack: " + ", ".join(
        f"{flag} (defined in {where})" for flag, where in sorted(missing.items())
    )
