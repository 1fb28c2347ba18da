"""The job JSON handed to the executor as a file, so it stays out of `docker inspect` and
out of the process list: the job may carry a Hugging Face token."""

from __future__ import annotations

import os

from hypha.accelerate_executor.errors import ShimError

JOB_FILE = ".hypha-job.json"


def write_job_file(work_dir: str, data: bytes, uid: int, gid: int) -> str:
    """Writes WORK_DIR/.hypha-job.json, mode 0600, owned by the executor's uid:gid (it is
    left in the work dir, which the worker deletes). Returns its path."""
    path = os.path.join(work_dir, JOB_FILE)
    try:
        # O_NOFOLLOW: a symlink planted in the work dir must not redirect the write.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ShimError(f"cannot write the job file {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # a file that was there keeps its mode through O_TRUNC
        owner = os.fstat(fd)
        if (owner.st_uid, owner.st_gid) != (uid, gid):
            try:
                os.fchown(fd, uid, gid)
            except PermissionError:
                raise ShimError(
                    f"cannot hand the job file to uid:gid {uid}:{gid}: the shim runs as uid "
                    f"{os.geteuid()}; run it as the worker's user (or as root)",
                ) from None
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    return path
