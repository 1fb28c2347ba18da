"""A job's work dir, made and removed as a Hypha worker does it."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from contextlib import suppress
from pathlib import Path

from hypha.accelerate_executor.worker_facts import MAX_SOCKET_PATH_BYTES
from hypha.standin.errors import WorkerError


def make_work_dir(work_base: Path, owner: tuple[int, int] | None) -> Path:
    """A fresh `hypha-<uuid>` under `work_base`, owned by `owner` when running as root, and
    short enough to hold the bridge's socket."""
    try:
        work_base.mkdir(parents=True, exist_ok=True)
        work_dir = work_base / f"hypha-{uuid.uuid4()}"
        work_dir.mkdir()
        if owner is not None and os.geteuid() == 0:
            os.chown(work_dir, *owner)
    except OSError as exc:
        raise WorkerError(f"cannot create a work dir under {work_base}: {exc.strerror}") from None
    socket_bytes = len(os.fsencode(work_dir / "bridge.sock"))
    if socket_bytes > MAX_SOCKET_PATH_BYTES:
        work_dir.rmdir()
        raise WorkerError(
            f"the socket path under {work_base} would be {socket_bytes} bytes, Unix sockets allow "
            f"{MAX_SOCKET_PATH_BYTES}: use a shorter work base"
        )
    return work_dir


def remove_work_dir(work_dir: Path, owner: tuple[int, int] | None) -> list[str]:
    """Deletes WORK_DIR as the worker's user would; returns what that user could not delete.

    As root with `owner`, the deletion runs as that uid/gid, so a file the executor made
    as another user (root in a container that ignored --user) shows up as the leak it is
    for a real worker; root then removes the rest so nothing stays behind here.
    """
    if owner is not None and os.geteuid() == 0 and owner[0] != 0:
        subprocess.run(
            ["find", str(work_dir), "-mindepth", "1", "-delete"],
            user=owner[0],
            group=owner[1],
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        leaks = [str(path) for path in _leaves(work_dir)]
        shutil.rmtree(work_dir, ignore_errors=True)
        return leaks
    leaks = _delete_tree(work_dir)
    with suppress(OSError):
        work_dir.rmdir()
    return leaks


def _leaves(directory: Path) -> list[Path]:
    """Files, links and empty directories under `directory`: what a failed delete left."""
    found = []
    for entry in os.scandir(directory):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            below = _leaves(path)
            found += below or [path]
        else:
            found.append(path)
    return found


def _delete_tree(directory: Path) -> list[str]:
    failed = []
    for entry in os.scandir(directory):
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                below = _delete_tree(path)
                failed += below
                if not below:
                    path.rmdir()
            else:
                path.unlink()
        except OSError:
            failed.append(str(path))
    return failed
