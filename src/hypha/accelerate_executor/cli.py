"""The `hypha-accelerate` console command.

Each sub-command lives in the module of the part it belongs to and is imported only
when called, so the host-side commands never import torch.
"""

from __future__ import annotations

import importlib
import sys

from hypha.accelerate_executor.entry import say_error
from hypha.accelerate_executor.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE

# sub-command -> (module, one-line help). Each module has `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "hypha.accelerate_executor.shim.run",
        "run one job's executor container (the worker starts this)",
    ),
    "worker-config": (
        "hypha.accelerate_executor.tools.worker_config",
        "print worker TOML [[executors]] entries",
    ),
    "doctor": (
        "hypha.accelerate_executor.tools.doctor",
        "check Docker, images, GPU runtime and work dir permissions",
    ),
    "selftest": (
        "hypha.selftest.command",
        "train a small job on this host's GPUs (or CPU): speed, MFU, memory, a verdict",
    ),
    "build": (
        "hypha.accelerate_executor.tools.builder.command",
        "build the executor image of one variant or all",
    ),
    "publish": (
        "hypha.accelerate_executor.tools.publish",
        "push built variants to a registry as multi-architecture tags",
    ),
    "local": (
        "hypha.standin.cli",
        "local stand-in for the Hypha side: demo, coordinator, worker",
    ),
    "schema": ("hypha.accelerate_executor.protocol.generation", "print the job spec's JSON Schema"),
}
# Why a command an installation leaves out is missing, where that is not just a module.
LEFT_OUT: dict[str, str] = {
    "build": "'build' needs a checkout of the project (it builds from docker/Dockerfile and "
    "docker/requirements): run it in one, installed with `pip install -e .`",
}


def usage() -> str:
    lines = ["usage: hypha-accelerate COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return EXIT_OK if args else EXIT_USAGE
    if args[0] == "--version":
        from hypha.accelerate_executor import __version__

        print(__version__)
        return EXIT_OK
    if args[0] not in COMMANDS:
        say_error("hypha-accelerate", f"unknown command {args[0]!r}; try --help")
        return EXIT_USAGE
    name = COMMANDS[args[0]][0]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # The runtime image keeps only what selftest needs of the stand-in: no `local`; the
        # wheel leaves `build` out.
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise
        why = LEFT_OUT.get(args[0], f"{args[0]!r} is not installed here ({exc.name} is missing)")
        say_error("hypha-accelerate", why)
        return EXIT_FAILED
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
