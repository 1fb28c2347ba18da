"""The image's entrypoint. A worker's `docker run IMAGE --socket ... --work-dir ...` reaches
the launcher (platform/launcher/); `docker run IMAGE selftest [...]` runs the selftest instead
(selftest/command.py), which proves the host the image runs on."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["selftest"]:
        from hypha.selftest.command import main as selftest

        return selftest(arguments[1:])
    from hypha.accelerate_executor.platform.launcher.command import main as launch

    return launch(arguments)


if __name__ == "__main__":
    sys.exit(main())
