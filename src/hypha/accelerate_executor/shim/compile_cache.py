"""HYPHA_COMPILE_CACHE: a host folder where the job containers keep torch.compile's caches
(inductor's graphs and kernels, Triton's), so that the next job on the host that runs the
same image starts with its kernels built instead of compiling for tens of seconds.

Opt-in, because the cache holds compiled code that later jobs load: every job of the worker
that runs the image reads and writes it, so a job whose model code is hostile could leave a
kernel behind for the jobs after it. Without it each container caches in its own /tmp, which
dies with it. One folder per image (its id), owned by the job's uid, mode 0700: a torch of
another image never reads it, and no other user of the host can.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CACHE_VARIABLE = "HYPHA_COMPILE_CACHE"
CONTAINER_PATH = "/var/cache/hypha-compile"


class CompileCacheRefused(Exception):
    """The host folder cannot serve as the job's compile cache."""


def cache_folder(root: str, image_id: str, owner: tuple[int, int]) -> Path:
    """ROOT/IMAGE (the image id's first 12 hex digits), made when missing and owned by
    `owner`; refused when it is a link or another user's."""
    folder = Path(root) / image_id.split(":")[-1][:12]
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.geteuid() == 0 and folder.stat().st_uid != owner[0]:
            os.chown(folder, *owner)  # a root shim makes it for the job's user
        info = folder.lstat()
    except OSError as exc:
        raise CompileCacheRefused(f"cannot make {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CompileCacheRefused(f"{folder} is not a folder (a link?)")
    if info.st_uid != owner[0]:
        raise CompileCacheRefused(
            f"{folder} belongs to uid {info.st_uid}, not the job's {owner[0]}"
        )
    return folder


def container_env() -> dict[str, str]:
    """Where torch and Triton cache in the container, instead of the image's /tmp."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": f"{CONTAINER_PATH}/torchinductor",
        "TRITON_CACHE_DIR": f"{CONTAINER_PATH}/triton",
    }
