"""`--variant mps-host`: the bundle as a host process. Mechanics with a stand-in launcher;
then a real job from a real bundle on the CPU torch (Linux has no Metal)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim_harness import SECRET_TOKEN, WorkerJob, shim_command, wait_for_line, wait_until

HERE = Path(__file__).parent
REPO = HERE.parents[1]


@pytest.fixture(scope="session")
def mps_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real bundle, made by the real build command (offline)."""
    output = tmp_path_factory.mktemp("bundle") / "mps-host"
    result = subprocess.run(
        shim_command("build", "mps-host", "--offline", "--output", str(output)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return output


@pytest.fixture
def fake_bundle(mps_bundle: Path, tmp_path: Path) -> Path:
    """The real bundle with its launcher swapped for the stand-in."""
    bundle = tmp_path / "fake-bundle"
    shutil.copytree(mps_bundle, bundle)
    shutil.copy(HERE / "fake_bundle_launcher.sh", bundle / "hypha-accelerate-mps")
    return bundle


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _host_args(job: WorkerJob, bundle: Path, *extra: str) -> list[str]:
    return [*job.run_args("--bundle", str(bundle), *extra, variant="mps-host", image=None)]


def _start(
    job: WorkerJob, bundle: Path, cache: Path, mode: str, *extra: str
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        shim_command(*_host_args(job, bundle, *extra)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={
            **os.environ,
            "FAKE_MODE": mode,
            "HYPHA_ACCELERATE_CACHE": str(cache),
            "JOB_JSON": job.job_json,
        },
    )
    job.processes.append(process)
    return process


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Killed members whose parent is gone stay
    zombies until init reaps them, which this machine's init does only every second or so
    (seen: 2 s), so they do not count: they run nothing."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rpartition(")")[2].split()[:3]
        except OSError:
            continue  # gone meanwhile
        if int(group) == pgid and state != "Z":
            return True
    return False


def _group_gone(pgid: int) -> None:
    wait_until(lambda: not _group_alive(pgid), timeout=2)


def _launcher_pgid(job: WorkerJob) -> int:
    """The process group of the bundle launcher running this job (found by its arguments)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"hypha-accelerate-mps" in cmdline and str(job.work_dir).encode() in cmdline:
                return os.getpgid(int(entry.name))
    raise AssertionError("no launcher process")


def test_launcher_gets_the_job_file_the_venv_and_a_clean_env(
    fake_bundle: Path, cache: Path, worker_job: WorkerJob
) -> None:
    process = _start(worker_job, fake_bundle, cache, "exit:7", "--trust-remote-code")
    out, err = process.communicate(timeout=30)
    assert process.returncode == 7, err
    lines = out.decode("utf-8").splitlines()
    job_file = worker_job.work_dir / ".hypha-job.json"
    assert lines[0] == (
        f"args --socket {worker_job.socket_path} --work-dir {worker_job.work_dir} --job @{job_file}"
    )
    venv = Path(lines[1].removeprefix("venv "))
    assert venv.parent == cache / "mps-venvs"
    assert lines[2:5] == ["job_json unset", "trust 1", "bad \ufffd bytes"]
    assert SECRET_TOKEN not in out.decode() + err.decode()
    assert job_file.stat().st_mode & 0o777 == 0o600


def test_remote_code_on_the_host_only_when_trusted(
    fake_bundle: Path, cache: Path, worker_job: WorkerJob
) -> None:
    """The host mode is not sandboxed: a model's own code runs only with --trust-remote-code."""
    out, _ = _start(worker_job, fake_bundle, cache, "exit:0").communicate(timeout=30)
    assert "trust unset" in out.decode().splitlines()


def test_sigterm_ends_the_whole_group(
    fake_bundle: Path, cache: Path, worker_job: WorkerJob
) -> None:
    process = _start(worker_job, fake_bundle, cache, "sleep")
    wait_for_line(process, b"ready")
    pgid = _launcher_pgid(worker_job)
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=10)
    assert process.returncode == 143
    assert out == b"got SIGTERM\n"
    assert err.decode().splitlines() == [
        "hypha-accelerate run: cancelled by SIGTERM; executor exit 143"
    ]
    assert time.monotonic() - start < 3.0
    _group_gone(pgid)  # the launcher's sleeping child went with it


def test_a_group_ignoring_sigterm_is_killed_within_the_workers_grace(
    fake_bundle: Path, cache: Path, worker_job: WorkerJob
) -> None:
    process = _start(worker_job, fake_bundle, cache, "ignore")
    wait_for_line(process, b"ready")
    pgid = _launcher_pgid(worker_job)
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=10)
    assert process.returncode == 143
    assert time.monotonic() - start < 5.0
    _group_gone(pgid)


def test_sigkill_of_the_shim_ends_the_group(
    fake_bundle: Path, cache: Path, worker_job: WorkerJob
) -> None:
    process = _start(worker_job, fake_bundle, cache, "ignore")
    wait_for_line(process, b"ready")
    pgid = _launcher_pgid(worker_job)
    process.kill()
    process.wait()
    wait_until(lambda: not _group_alive(pgid), timeout=30)  # the watchdog's work, not its speed


def test_venv_location_follows_the_bundle(fake_bundle: Path, cache: Path, monkeypatch: Any) -> None:
    from hypha.accelerate_executor.shim.mps_bundle import Bundle

    monkeypatch.setenv("HYPHA_ACCELERATE_CACHE", str(cache))
    first = Bundle(fake_bundle).venv_dir()
    assert first == Bundle(fake_bundle).venv_dir()
    with (fake_bundle / "requirements.txt").open("a") as file:
        file.write("six==1.17.0\n")
    assert Bundle(fake_bundle).venv_dir() != first


def test_not_a_bundle(cache: Path, worker_job: WorkerJob, tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("")
    result = subprocess.run(
        shim_command(*_host_args(worker_job, tmp_path)), capture_output=True, check=False
    )
    assert result.returncode == 125
    [line] = result.stderr.decode().splitlines()
    assert "is not an mps-host bundle: no hypha-accelerate-mps" in line
    assert "hypha-accelerate build mps-host" in line


# A real job: the real bundle's launcher, in a venv made the way the launcher makes it
# (python -m venv, the bundle's wheel), except that instead of installing the pinned
# requirements (1.2 GB of torch and friends) it reuses this checkout's venv through a .pth.


def _prepare_venv(bundle: Path, venv: Path) -> None:
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    [site] = (venv / "lib").glob("python*/site-packages")
    [inherited] = (REPO / ".venv" / "lib").glob("python*/site-packages")
    (site / "inherit-dev-venv.pth").write_text(
        f"import site; site.addsitedir({str(inherited)!r})\n"
    )
    [wheel] = bundle.glob("hypha_accelerate_executor-*.whl")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps"]
    subprocess.run([*pip, "--no-index", str(wheel)], check=True)


@pytest.fixture
def real_bundle_venv(mps_bundle: Path, cache: Path, monkeypatch: Any) -> Iterator[Path]:
    from hypha.accelerate_executor.shim.mps_bundle import Bundle

    monkeypatch.setenv("HYPHA_ACCELERATE_CACHE", str(cache))
    venv = Bundle(mps_bundle).venv_dir()
    _prepare_venv(mps_bundle, venv)
    yield venv


@pytest.mark.slow
def test_a_real_job_through_the_bundle(
    mps_bundle: Path, real_bundle_venv: Path, work_base: Path
) -> None:
    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.worker.executor_entries import EXECUTOR_ARGS, ExecutorEntry
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    shim = shutil.which("hypha-accelerate", path=str(Path(sys.executable).parent))
    assert shim is not None
    entry = ExecutorEntry(
        shim, ("run", "--variant", "mps-host", "--bundle", str(mps_bundle), *EXECUTOR_ARGS)
    )
    coordinator = build_coordinator(
        Catalog.from_assets(ensure_assets()),
        RunOptions(workers=1, rounds=2, steps_per_round=4, generation="alpha17"),
    )
    coordinator.start()
    try:
        worker = LocalWorker("w1", entry, work_base / "mps")
        serve_one_job(CoordinatorClient(coordinator.url), worker)
        record = dict(coordinator.summary()["workers"]["w1"])
    finally:
        coordinator.stop()
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert record["leaks"] == []
    # The job ran in the prepared venv, not in one the launcher made anew.
    assert [p.name for p in real_bundle_venv.parent.iterdir()] == [real_bundle_venv.name]


def test_the_guard_runs_before_the_group_does(tmp_path: Path) -> None:
    """No moment in which a SIGKILLed shim leaks its group: the watchdog is already running
    when the group's first command starts (a guard started after the work left a window as
    long as a Python start, which under load outlasted the test above)."""
    from hypha.accelerate_executor.shim.mps_bundle import run_group
    from hypha.accelerate_executor.supervisor import Interrupts

    seen = tmp_path / "guards"
    # The group's command lists the watchdogs whose parent is this process (the shim here);
    # the pattern does not match the command line of the sh that greps for it.
    script = (
        "for p in /proc/[0-9]*; do "
        f'[ "$(cut -d" " -f4 $p/stat 2>/dev/null)" = {os.getpid()} ] && '
        f"grep -qa 'shim[.]watchdog' $p/cmdline 2>/dev/null && echo guard >> {seen}; done; true"
    )
    assert run_group(["sh", "-c", script], dict(os.environ), Interrupts(signals=())) == 0
    assert seen.read_text() == "guard\n"
