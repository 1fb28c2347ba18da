"""The packages' import graph, read from the source with `ast`: every import (at the top,
inside a function or under TYPE_CHECKING) goes to the same layer or one below, and no
modules import each other in a circle.

The layers, bottom to top (docs/architecture.md: Layers), one or more folders each:

    ground    errors (the error tree, exit codes), entry (argument parser, run_main), supervisor
              (a child in its own process group), telemetry/ (OTLP export), worker_facts (two
              facts of a worker's host)
    protocol  protocol/: the job spec and the bridge's messages, a folder per generation
    platform  platform/: variants, this host's GPUs, architectures, image tags, the launcher
    bridge    bridge/: the Job Bridge client of both generations
    training  training/: the loops and their parts
    shim      shim/: what runs one job's container on the worker's host
    standin   hypha.standin: the stand-in for Hypha's side, its services in their folders
    selftest  hypha.selftest: trains a stand-in job through the executor
    tools     tools/: doctor, worker-config, build, publish
    command   cli, the `hypha-accelerate` dispatcher, and image_entry, the image's

Beyond the layers: the stand-in reaches the executor only for its protocol and the ground's
errors, entry and supervisor (and worker_facts), and the executor below its command layer
imports neither the stand-in nor the selftest.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import REPO

NAMESPACE = "hypha"
ROOT = REPO / "src" / "hypha"
EXECUTOR = "accelerate_executor"


def executor(*names: str) -> tuple[str, ...]:
    return tuple(f"{EXECUTOR}.{name}" if name else EXECUTOR for name in names)


# Bottom to top: a module's layer is the first whose names or prefixes hold it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", executor("", "errors", "entry", "supervisor", "telemetry", "worker_facts")),
    ("protocol", executor("protocol")),
    ("platform", executor("platform")),
    ("bridge", executor("bridge")),
    ("training", executor("training")),
    ("shim", executor("shim")),
    ("standin", ("standin",)),
    ("selftest", ("selftest",)),
    ("tools", executor("tools")),
    ("command", executor("cli", "image_entry")),
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
            if name.startswith(NAMESPACE + "."):
                relative = name.removeprefix(NAMESPACE + ".")
                if is_module(relative):
                    found.add(relative)
    return found


def graph() -> dict[str, set[str]]:
    return {
        module_name(path): imports_of(path) - {module_name(path)}
        for path in sorted(ROOT.rglob("*.py"))
    }


def layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        # The package itself (its __init__) is ground; its folders are not.
        if any(module == p or (p != EXECUTOR and module.startswith(p + ".")) for p in prefixes):
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
    assert f"{EXECUTOR}.errors" in edges[f"{EXECUTOR}.protocol.job"]
    assert "standin.worker.bridge_core" in edges["standin.worker.bridge_http"]
    assert "standin.alpha17.bridge" in edges["standin.alpha17.bridge_http"]
    assert f"{EXECUTOR}.shim.engine" in edges[f"{EXECUTOR}.shim.run"]
    assert "standin.data_service.assets" in edges["selftest.runs"]
    assert f"{EXECUTOR}.errors" in edges["standin.errors"]
    assert "selftest.command" in edges[f"{EXECUTOR}.image_entry"]


def test_no_import_goes_up_a_layer() -> None:
    upward = [
        f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


# What the stand-in may import of the executor: the protocol, and the ground's modules about
# errors, exits and a worker's host (entry's parser and run_main, a supervised child).
STANDIN_MAY_IMPORT = executor("protocol", "errors", "entry", "supervisor", "worker_facts")
# The executor's modules that may start the stand-in or the selftest: its command layer.
COMMANDS = executor("cli", "image_entry")


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_standin_imports_only_the_protocol_and_the_ground_of_the_executor() -> None:
    reached = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if within(module, ("standin",))
        for target in sorted(targets)
        if within(target, (EXECUTOR,)) and not within(target, STANDIN_MAY_IMPORT)
    ]
    assert not reached, "\n".join(reached)


def test_the_executor_imports_neither_the_standin_nor_the_selftest() -> None:
    reached = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if within(module, (EXECUTOR,)) and not within(module, COMMANDS)
        for target in sorted(targets)
        if within(target, ("standin", "selftest"))
    ]
    assert not reached, "\n".join(reached)


# The bridge generations, each a folder in every layer that has one of its own
# (protocol/, training/, the stand-in), and the one module per layer that names them all:
# retiring a generation deletes its folders and one row in each of these.
GENERATION_FOLDERS = ("alpha17", "actions")
GENERATION_TABLES = {
    f"{EXECUTOR}.protocol.generation",  # which generation a job is for, the probe
    f"{EXECUTOR}.training.main",  # each generation's loop
    "standin.generations",  # each generation's coordinator
    "standin.worker.bridges",  # each generation's bridge
}


def generation_of_module(module: str) -> str | None:
    return next((g for g in GENERATION_FOLDERS if g in module.split(".")), None)


def test_each_generation_is_reached_only_from_its_own_folders_and_the_tables() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in sorted(targets)
        if (wanted := generation_of_module(target)) is not None
        and generation_of_module(module) != wanted
        and module not in GENERATION_TABLES
    ]
    assert not wrong, "\n".join(wrong)
    # The tables do name both (so that this test cannot pass by finding no generation).
    edges = graph()
    for table in GENERATION_TABLES:
        named = {generation_of_module(target) for target in edges[table]}
        assert {"alpha17", "actions"} & named, table


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert not circles(graph())


def test_a_circle_and_an_upward_import_are_seen() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert (
        layer(f"{EXECUTOR}.errors")
        < layer(f"{EXECUTOR}.protocol.job")
        < layer(f"{EXECUTOR}.shim.run")
    )
    assert layer(f"{EXECUTOR}.shim.run") < layer("standin.worker.worker") < layer("selftest.runs")
    assert layer("selftest.runs") < layer(f"{EXECUTOR}.tools.doctor") < layer(f"{EXECUTOR}.cli")
