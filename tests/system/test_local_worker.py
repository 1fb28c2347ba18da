"""The local worker does per job what docs/protocol.md section 1 says a Hypha worker does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hypha.accelerate_executor.errors import UsageError
from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.errors import WorkerError
from hypha.standin.worker.executor_entries import (
    ExecutorEntry,
    executor_entry,
    load_toml_entry,
    substitute,
)
from hypha.standin.worker.worker import LocalWorker, serve_one_job
from repo_paths import TESTS

EXAMPLE_TOML = TESTS / "data" / "worker-executors.toml"


def python_child(code: str, *args: str) -> ExecutorEntry:
    return ExecutorEntry(sys.executable, ("-c", textwrap.dedent(code), *args))


@pytest.fixture
def job(make_coordinator):
    coordinator = make_coordinator(workers=1)
    client = CoordinatorClient(coordinator.url)
    job_json = client.request_job("w1")
    return coordinator, client, job_json, client.backend(json.loads(job_json)["job_id"])


def wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_substitute_replaces_known_tokens_anywhere_in_one_pass():
    values = {"SOCKET_PATH": "/w/bridge.sock", "WORK_DIR": "/w", "JOB_JSON": '{"x": "{WORK_DIR}"}'}
    assert substitute("--socket={SOCKET_PATH}", values) == "--socket=/w/bridge.sock"
    assert substitute("{WORK_DIR}:{WORK_DIR}", values) == "/w:/w"
    assert substitute("{JOB_JSON}", values) == '{"x": "{WORK_DIR}"}'
    assert substitute("{GPU_ID} {work_dir} {WORK_DIR", values) == "{GPU_ID} {work_dir} {WORK_DIR"


def test_tokens_args_env_output_and_cleanup(job, short_dir, capsys):
    _, _, job_json, backend = job
    child = python_child(
        """
        import json, os, socket, sys
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(os.environ["SOCKET_PATH"])  # the bridge is up before the executor starts
        env = {key: os.environ[key] for key in ("SOCKET_PATH", "WORK_DIR", "JOB_JSON")}
        print(json.dumps({"argv": sys.argv[1:], "env": env}))
        print("second line")
        """,
        "--socket", "{SOCKET_PATH}",
        "--mount={WORK_DIR}:{WORK_DIR}",
        "--job", "{JOB_JSON}",
        "{UNKNOWN}",
    )  # fmt: skip
    result = LocalWorker("w1", child, short_dir).run(job_json, backend)
    assert result.exit_code == 0 and result.leaks == []
    lines = capsys.readouterr().out.splitlines()
    reported = json.loads(
        next(line for line in lines if line.startswith("[w1] {")).removeprefix("[w1] ")
    )
    work_dir = str(result.work_dir)
    socket_path = f"{work_dir}/bridge.sock"
    assert Path(work_dir).parent == short_dir and Path(work_dir).name.startswith("hypha-")
    assert reported["argv"] == [
        "--socket",
        socket_path,
        f"--mount={work_dir}:{work_dir}",
        "--job",
        job_json,
        "{UNKNOWN}",
    ]
    assert reported["env"] == {
        "SOCKET_PATH": socket_path,
        "WORK_DIR": work_dir,
        "JOB_JSON": job_json,
    }
    assert "[w1] second line" in lines
    assert not Path(work_dir).exists()


def test_exit_code_is_passed_on_and_keep_work_dir_keeps_it(job, short_dir):
    _, _, job_json, backend = job
    child = python_child(
        "import os, sys; open(os.environ['WORK_DIR'] + '/left.txt', 'w').write('x'); sys.exit(3)"
    )
    result = LocalWorker("w1", child, short_dir, keep_work_dir=True).run(job_json, backend)
    assert result.exit_code == 3
    assert (result.work_dir / "left.txt").read_text() == "x"
    assert not (result.work_dir / "bridge.sock").exists()


def run_and_cancel(worker: LocalWorker, job_json: str, backend) -> int:
    """Runs the worker in a thread and cancels once the child says it is ready."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run(job_json, backend).exit_code))
    thread.start()
    wait_for(lambda: any(worker.work_base.glob("hypha-*/ready")), "the child to start")
    worker.cancel()
    thread.join(30)
    assert not thread.is_alive()
    return codes[0]


def test_cancel_sends_sigterm(job, short_dir):
    _, _, job_json, backend = job
    child = python_child(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        open(os.environ["WORK_DIR"] + "/ready", "w").close()
        time.sleep(60)
        """
    )
    assert run_and_cancel(LocalWorker("w1", child, short_dir), job_json, backend) == 143
    assert list(short_dir.iterdir()) == []


def test_cancel_kills_a_child_that_ignores_sigterm_after_5_s(job, short_dir, capsys):
    _, _, job_json, backend = job
    child = python_child(
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.environ["WORK_DIR"] + "/ready", "w").close()
        time.sleep(60)
        """
    )
    assert run_and_cancel(LocalWorker("w1", child, short_dir), job_json, backend) == 128 + 9
    assert "ignored SIGTERM after 5 s: SIGKILL" in capsys.readouterr().err
    assert list(short_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "import sys, time; print('fine', flush=True); sys.stdout.buffer.write(b'\\xff\\xfe\\n'); sys.stdout.flush(); time.sleep(60)",
            "non-UTF-8",
        ),
        ("import os, time; os.close(1); time.sleep(60)", "closed its stdout"),
    ],
)
def test_stdout_that_breaks_gets_the_child_killed(job, short_dir, capsys, code, message):
    _, _, job_json, backend = job
    result = LocalWorker("w1", python_child(code), short_dir, kill_after_s=0.5).run(
        job_json, backend
    )
    assert result.exit_code == 128 + 9
    assert message in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="playing a non-root worker needs root")
def test_files_the_workers_user_cannot_delete_are_reported_as_leaks(job, short_dir):
    _, _, job_json, backend = job
    # Runs as root, like a container that ignored --user: a root-owned folder with a file
    # in it cannot be emptied by the worker's user.
    child = python_child(
        """
        import os
        work = os.environ["WORK_DIR"]
        os.makedirs(work + "/rootdir")
        open(work + "/rootdir/file", "w").close()
        open(work + "/root-owned-but-deletable", "w").close()
        """
    )
    result = LocalWorker("w1", child, short_dir, owner=(4321, 4321)).run(job_json, backend)
    assert result.exit_code == 0
    assert result.leaks == [f"{result.work_dir}/rootdir/file"]
    assert not result.work_dir.exists()


def test_coordinator_cancellation_reaches_the_executor(make_coordinator, short_dir):
    coordinator = make_coordinator(workers=1)
    child = python_child(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        open(os.environ["WORK_DIR"] + "/ready", "w").close()
        time.sleep(60)
        """
    )
    worker = LocalWorker("w1", child, short_dir)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(serve_one_job(CoordinatorClient(coordinator.url), worker))
    )
    thread.start()
    wait_for(lambda: any(short_dir.glob("hypha-*/ready")), "the child to start")
    coordinator.cancel("test over")
    thread.join(30)
    assert codes == [143]
    assert coordinator.wait_finished(10)
    assert [record.exit_code for record in coordinator.workers.values()] == [143]


def test_worker_errors_are_one_line(short_dir, job):
    _, _, job_json, backend = job
    with pytest.raises(WorkerError, match="cannot start the executor /nonexistent/executor"):
        LocalWorker("w1", ExecutorEntry("/nonexistent/executor", ()), short_dir).run(
            job_json, backend
        )
    assert list(short_dir.iterdir()) == []
    long_base = short_dir / ("x" * 80)
    with pytest.raises(WorkerError, match="Unix sockets allow 107"):
        LocalWorker("w1", python_child("pass"), long_base).run(job_json, backend)


def test_executor_entries_from_presets_and_toml(tmp_path):
    process = executor_entry("process")
    assert process.cmd == sys.executable
    assert process.args == (
        "-m",
        "hypha.accelerate_executor.training",
        "--socket",
        "{SOCKET_PATH}",
        "--work-dir",
        "{WORK_DIR}",
    )  # the job comes as JOB_JSON in the environment, as the worker exports it
    shim = executor_entry("shim")
    assert shim.cmd.endswith("hypha-accelerate")
    assert shim.args[:3] == ("run", "--variant", "cpu")
    example = load_toml_entry(EXAMPLE_TOML)
    assert example.cmd == "docker" and example.args[-6:] == (
        "--socket",
        "{SOCKET_PATH}",
        "--work-dir",
        "{WORK_DIR}",
        "--job",
        "{JOB_JSON}",
    )
    assert executor_entry(f"toml:{EXAMPLE_TOML}") == example
    with pytest.raises(UsageError, match="unknown executor preset"):
        executor_entry("docker")
    only_aggregate = tmp_path / "aggregate.toml"
    only_aggregate.write_text(
        '[[executors]]\nclass = "aggregate"\nname = "parameter-server"\nruntime = "parameter-server"\n'
    )
    with pytest.raises(UsageError, match="no \\[\\[executors\\]\\] entry"):
        load_toml_entry(only_aggregate)
    broken = tmp_path / "broken.toml"
    broken.write_text("[[executors]\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_toml_entry(broken)
    with pytest.raises(UsageError, match="cannot read"):
        load_toml_entry(tmp_path / "missing.toml")


def test_a_lingering_worker_outlasts_the_coordinator_and_leaves_when_stopped(
    make_coordinator, short_dir, tmp_path
):
    """`local worker --linger`, as compose runs it: compose ends the run at the first
    container's exit, which must be the coordinator's (its code is the verdict). So after its
    job the worker stays, even once the coordinator has stopped serving, until SIGTERM, and
    then exits with its job's code."""
    coordinator = make_coordinator(workers=1)
    config = tmp_path / "worker.toml"
    config.write_text(
        '[[executors]]\nclass = "train"\nruntime = "process"\n'
        f'cmd = {json.dumps(sys.executable)}\nargs = ["-c", "import sys; sys.exit(3)"]\n'
    )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "hypha.accelerate_executor.cli", "local", "worker"),
            *("--name", "w1", "--coordinator", coordinator.url, "--linger"),
            *("--executor", f"toml:{config}", "--work-base", str(short_dir)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: coordinator.summary()["workers"].get("w1", {}).get("exit_code") == 3,
            "the job's exit",
            timeout_s=60,
        )
        coordinator.stop()
        # The old worker polled the coordinator every second and left once it was gone.
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=5)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 3, worker.stdout.read().decode() if worker.stdout else ""
    finally:
        worker.kill()
        worker.wait()
