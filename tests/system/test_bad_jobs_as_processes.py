"""Bad jobs as the worker hands them over, to the real entry points as processes: whatever
the bytes, exit 2 with exactly one line on stderr, nothing on stdout, nothing written to
the work dir, and (the shim) no container."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.errors import JobSpecError
from hypha.accelerate_executor.protocol.generation import parse_any_job_bytes
from job_mutations import mutations

SAMPLE = 50
EXECUTOR = [sys.executable, "-m", "hypha.accelerate_executor.training"]
SHIM = [sys.executable, "-m", "hypha.accelerate_executor.cli", "run", "--variant", "cpu"]
SECRET = b"hf_secretTOKEN"  # job_mutations puts it into some jobs' fields


@dataclass(frozen=True)
class BadJob:
    name: str
    data: bytes
    via: str  # "argv", "env" or "file"; "dir" gives a directory as @path


def _refused(data: bytes) -> bool:
    """Refused whichever bridge generation the job is for: a job only one accepts runs."""
    try:
        parse_any_job_bytes(data)
    except JobSpecError:
        return True
    return False


def bad_jobs() -> list[BadJob]:
    example = mutations(seed=0, count=1)[0]
    special = [
        BadJob("invalid UTF-8", example.replace(b"causal-lm", b"causal-\xff\xfelm"), "argv"),
        BadJob("lone surrogate escape", example.replace(b"markov-512", b"markov\\ud800"), "env"),
        BadJob("surrogate as bytes", example.replace(b"markov-512", b"markov\xed\xa0\x80"), "env"),
        BadJob("10 MB of nesting", b"[" * 5_000_000 + b"]" * 5_000_000, "file"),
        BadJob("empty file", b"", "file"),
        BadJob(
            "a task the table refuses", example.replace(b"causal-lm", b"object-detection"), "env"
        ),
        BadJob("a directory as @path", b"", "dir"),
    ]
    generated = [case for case in mutations(seed=29, count=2000) if _refused(case)]
    ways = ("argv", "env", "file")
    sample = [
        # argv and the environment cannot carry NUL bytes, nor more than 128 KiB.
        BadJob(
            f"mutation {i}",
            case,
            ways[i % 3] if b"\0" not in case and len(case) < 100_000 else "file",
        )
        for i, case in enumerate(generated[: SAMPLE - len(special)])
    ]
    return special + sample


BAD_JOBS = bad_jobs()


@pytest.fixture
def job_dir(short_tmp: Path) -> Iterator[tuple[Path, Path]]:
    """A work dir with a listening bridge socket, and a folder for job files beside it."""
    work_dir = short_tmp / "work"
    work_dir.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(work_dir / "bridge.sock"))
    listener.listen(1)
    files = short_tmp / "files"
    files.mkdir()
    yield work_dir, files
    listener.close()


def _run(command: list[str], job: BadJob, work_dir: Path, files: Path, i: int) -> Any:
    env: dict[Any, Any] = {k: v for k, v in os.environ.items() if k != "JOB_JSON"}
    args: list[Any] = [
        *command,
        "--socket",
        str(work_dir / "bridge.sock"),
        "--work-dir",
        str(work_dir),
    ]
    if job.via == "argv":
        args += [b"--job", job.data]
    elif job.via == "env":
        env[b"JOB_JSON"] = job.data
    elif job.via == "dir":
        args += ["--job", f"@{files}"]
    else:
        path = files / f"job-{i}.json"
        path.write_bytes(job.data)
        args += ["--job", f"@{path}"]
    return subprocess.run(args, env=env, capture_output=True, timeout=120, check=False)


def _judge(command: list[str], work_dir: Path, files: Path) -> list[str]:
    """Runs every bad job (four at a time); returns what went wrong, one line per job."""
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda ij: _run(command, ij[1], work_dir, files, ij[0]), enumerate(BAD_JOBS))
        )
    wrong = []
    for job, result in zip(BAD_JOBS, results, strict=True):
        lines = result.stderr.splitlines()
        if result.returncode != 2 or len(lines) != 1 or result.stdout or SECRET in result.stderr:
            wrong.append(
                f"{job.name} via {job.via}: exit {result.returncode}, stderr {result.stderr[-300:]!r}"
            )
    return wrong


def test_the_sample_is_what_it_claims() -> None:
    assert len(BAD_JOBS) == SAMPLE
    assert all(_refused(job.data) for job in BAD_JOBS if job.via != "dir")
    assert {job.via for job in BAD_JOBS} == {"argv", "env", "file", "dir"}


def test_the_executor_refuses_every_bad_job_in_one_line(job_dir: tuple[Path, Path]) -> None:
    work_dir, files = job_dir
    assert _judge(EXECUTOR, work_dir, files) == []
    assert [p.name for p in work_dir.iterdir()] == ["bridge.sock"]


@pytest.mark.docker
def test_the_shim_refuses_every_bad_job_in_one_line_and_starts_nothing(
    job_dir: tuple[Path, Path], docker_api: Any
) -> None:
    work_dir, files = job_dir
    assert _judge(SHIM, work_dir, files) == []
    assert [p.name for p in work_dir.iterdir()] == ["bridge.sock"]
    label = f"hypha.accelerate.work-dir={work_dir}"
    assert docker_api.containers(all=True, filters={"label": label}) == []
