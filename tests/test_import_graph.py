"""The package's import graph, read from the source with `ast`: every import (at the top,
inside a function or under TYPE_CHECKING) goes to the same layer or one below, and no
modules import each other in a circle.

The layers, bottom to top (docs/architecture.md: Layers):

    ground    errors (the error tree, exit codes), entry (argument parser, run_main), version,
              telemetry (OTLP export, which entry's one-line failure feeds)
    format    serde_json, serde, paths, supervisor, tensorfile, http_wire: no notion of a job
    job       job: the job spec, declared once
    executor  what runs in the image: bridge, training and what it stacks on, launcher
    shim      the host side: shim/*
    local     the stand-in for Hypha's side: local/*
    selftest  the host's proof: trains a stand-in job through the executor, selftest/*
    command   cli, the `hypha-accelerate` dispatcher, and image_entry, the image's
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "hypha.accelerate_executor"
ROOT = Path(__file__).resolve().parents[1] / "src" / "hypha" / "accelerate_executor"

# Bottom to top: a module's layer is the first whose names or prefixes hold it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("", "errors", "entry", "telemetry")),
    ("format", ("serde_json", "serde", "paths", "supervisor", "tensorfile", "http_wire")),
    # Torch-free tables the job spec, the launcher and the shim all read.
    ("tables", ("tasks", "variants")),
    ("job", ("job",)),
    (
        "executor",
        (
            "action_bridge",
            "action_loop",
            "actions",
            "bridge",
            "data",
            "diloco",
            "distributed",
            "gpu_host",
            "inputs",
            "launcher",
            "modeling",
            "optimization",
            "progress",
            "speculative",
            "steps",
            "sync",
            "training",
            "workbench",
        ),
    ),
    ("shim", ("shim",)),
    ("local", ("local",)),
    ("selftest", ("selftest",)),
    ("command", ("cli", "image_entry")),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(part for part in parts if part != "__init__")


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The package's modules that `path` imports anywhere in its text."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package.x import y`: y may be a module of its own, or a name in x.
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                relative = name.removeprefix(PACKAGE).removeprefix(".")
                if is_module(relative) or relative == "":
                    found.add(relative)
    return found


def graph() -> dict[str, set[str]]:
    return {
        module_name(path): imports_of(path) - {module_name(path)}
        for path in sorted(ROOT.rglob("*.py"))
    }


def layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p and module.startswith(p + ".")) for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(edges.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_the_graph_is_read_from_the_source() -> None:
    edges = graph()
    # Known arrows, so that a reader that finds nothing cannot pass the tests below.
    assert "errors" in edges["job"]
    assert "local.bridge_core" in edges["local.bridge_http"]
    assert "shim.engine" in edges["shim.run"]


def test_no_import_goes_up_a_layer() -> None:
    upward = [
        f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert not circles(graph())


def test_a_circle_and_an_upward_import_are_seen() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("errors") < layer("job") < layer("shim.run") < layer("local.worker")
