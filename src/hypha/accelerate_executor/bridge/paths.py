"""Paths relative to a job's work dir, checked so that nothing escapes it."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hypha.accelerate_executor.errors import UnsafePathError


def resolve_in_work_dir(work_dir: Path, relative: str) -> Path:
    """Returns WORK_DIR/relative, refusing absolute paths, `..` and symlinks leading outside."""
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts:
        raise UnsafePathError(f"refused path {relative!r}: not a relative path inside the work dir")
    root = work_dir.resolve()
    resolved = (root / pure).resolve()
    if not resolved.is_relative_to(root):
        raise UnsafePathError(f"refused path {relative!r}: it resolves outside the work dir")
    return resolved
