"""Real jobs: the cpu image and the executor against the local stand-in of the Hypha side,
started through the shim (the `shim` preset) and through worker-config's entries."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hypha.accelerate_executor.platform.image_tags import image_tags
from hypha.standin.jobs import JOB_DEFAULTS
from shim_harness import WORKER_GID, WORKER_UID, shim_command

if TYPE_CHECKING:
    from hypha.standin.jobs import JobKind

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="session")
def cpu_image(docker_api: Any) -> str:
    for tag in image_tags("cpu"):
        if docker_api.images(name=tag):
            return tag
    pytest.fail("no cpu executor image: `hypha-accelerate build cpu --offline` makes it")


@pytest.fixture
def job_base(work_base: Path) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(dir=work_base))
    base.chmod(0o755)
    yield base
    left = list(base.iterdir())
    assert left == [], f"work dirs left behind: {left}"
    base.rmdir()


def containers_under(api: Any, base: Path) -> list[str]:
    """Containers, running or not, of jobs whose work dir was under `base`."""
    return [
        c["Id"]
        for c in api.containers(all=True, filters={"label": "hypha.accelerate.work-dir"})
        if c["Labels"]["hypha.accelerate.work-dir"].startswith(f"{base}/")
    ]


def run_job(
    entry: Any, base: Path, rounds: int, steps: int, cancel_after: int = 0, token: str | None = None
) -> dict[str, Any]:
    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.coordinator.server import Catalog, RunOptions, coordinator_class
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    class TokenCoordinator(coordinator_class("alpha17")):
        """Hands out jobs whose model reference carries a Hugging Face token."""

        def job_spec(self, job_id: str) -> dict[str, Any]:
            spec = super().job_spec(job_id)
            spec["executor"]["config"]["model"]["artifact"]["token"] = token
            return spec

    coordinator = TokenCoordinator(
        Catalog.from_assets(ensure_assets()),
        RunOptions(workers=1, rounds=rounds, steps_per_round=steps, generation="alpha17"),
    )
    coordinator.start()
    try:
        worker = LocalWorker("w1", entry, base, owner=(WORKER_UID, WORKER_GID))
        if cancel_after:

            def cancel() -> None:
                while (
                    coordinator.summary()["workers"]
                    .get("w1", {})
                    .get("rounds", [{}])[0]
                    .get("batches", 0)
                    < cancel_after
                ):
                    time.sleep(0.2)
                worker.cancel()

            threading.Thread(target=cancel, daemon=True).start()
        serve_one_job(CoordinatorClient(coordinator.url), worker)
        return dict(coordinator.summary()["workers"]["w1"])
    finally:
        coordinator.stop()


def test_job_through_the_shim(cpu_image: str, job_base: Path, docker_api: Any) -> None:
    from hypha.standin.worker.executor_entries import preset

    record = run_job(preset("shim"), job_base, rounds=2, steps=4)
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert sorted(record["metrics"]) == [1, 2]
    assert record["leaks"] == []  # deleted as the worker's uid
    assert containers_under(docker_api, job_base) == []


def test_cancelled_job_through_the_shim(cpu_image: str, job_base: Path, docker_api: Any) -> None:
    from hypha.standin.worker.executor_entries import preset

    record = run_job(preset("shim"), job_base, rounds=1, steps=100_000, cancel_after=2)
    assert record["exit_code"] == 143
    assert record["leaks"] == []
    assert containers_under(docker_api, job_base) == []


def test_job_through_worker_configs_docker_entry(
    cpu_image: str, job_base: Path, tmp_path: Path
) -> None:
    from hypha.standin.worker.executor_entries import executor_entry

    config = tmp_path / "worker.toml"
    result = subprocess.run(
        shim_command(
            "worker-config",
            "--variant",
            "cpu",
            "--mode",
            "docker",
            "--user",
            f"{WORKER_UID}:{WORKER_GID}",
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    config.write_text(result.stdout.replace(image_tags("cpu")[0], cpu_image))
    record = run_job(executor_entry(f"toml:{config}"), job_base, rounds=2, steps=4)
    assert record["exit_code"] == 0
    assert record["rounds_completed"] == 2
    assert record["leaks"] == []


def test_no_token_in_any_process_list_during_a_real_job(
    cpu_image: str, job_base: Path, tmp_path: Path
) -> None:
    """worker-config's shim entry, run the worker's way (JOB_JSON exported) on a job whose
    reference carries a token: `ps -eo args` on the host, which sees the container's
    processes too, never shows it."""
    from hypha.standin.worker.executor_entries import executor_entry

    token = "hf_psSecretToken0123456789"
    config = tmp_path / "worker.toml"
    printed = subprocess.run(
        shim_command("worker-config", "--variant", "cpu", "--mode", "shim"),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    config.write_text(printed.stdout)
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            # -ww: whole command lines, however long (a job JSON would be).
            ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
            seen.extend(line for line in ps.splitlines() if str(job_base) in line or token in line)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        record = run_job(executor_entry(f"toml:{config}"), job_base, rounds=2, steps=4, token=token)
    finally:
        done.set()
        watcher.join()
    assert record["exit_code"] == 0
    assert [line for line in seen if token in line] == []
    # The watch saw the job's processes: the shim, and the executor in its container.
    assert any(
        "accelerate_executor.cli run" in line or "hypha-accelerate run" in line for line in seen
    )
    assert any("hypha.accelerate_executor.training" in line for line in seen)
    print("\n".join(sorted(set(seen))))


def run_through_worker_configs_shim_entry(
    job: JobKind, job_base: Path, tmp_path: Path, docker_api: Any
) -> dict[str, Any]:
    """A local job kind on two workers, each running worker-config's cpu entry as printed;
    its summary, once every worker ran clean and left nothing behind. Prints the figures."""
    from hypha.standin.coordinator.server import RunOptions
    from hypha.standin.demo import run_demo
    from hypha.standin.worker.executor_entries import executor_entry

    config = tmp_path / "worker.toml"
    printed = subprocess.run(
        shim_command("worker-config", "--variant", "cpu"),
        capture_output=True,
        text=True,
        check=True,
    )
    config.write_text(printed.stdout)
    out = tmp_path / "out"
    code = run_demo(
        RunOptions.for_job(job, workers=2, generation="alpha17"),
        executor_entry(f"toml:{config}"),
        out_dir=out,
        work_base=job_base,
        owner=(WORKER_UID, WORKER_GID),
        timeout_s=600,
    )
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert code == 0, summary["reasons"]
    for worker in summary["workers"].values():
        assert worker["violations"] == [] and worker["leaks"] == []
        # The executor trained exactly the batches it reported.
        assert worker["batches_trained"] == worker["batches_reported"]
    assert containers_under(docker_api, job_base) == []
    # The figures for the record: loss per round, samples/s, reported vs trained, overshoot.
    print(json.dumps({"rounds": summary["rounds"], "workers": {
        name: {key: worker[key] for key in (
            "samples_per_s", "batches_reported", "batches_trained", "overshoot", "slices_repeated")}
        for name, worker in summary["workers"].items()}}, indent=1))  # fmt: skip
    return summary


def test_default_hypha_job_through_worker_configs_shim_entry(
    cpu_image: str, job_base: Path, tmp_path: Path, docker_api: Any
) -> None:
    """Upstream's default job (LeNet remote code, an image preprocessor, batch 600 over
    1000-sample slices)."""
    summary = run_through_worker_configs_shim_entry("lenet", job_base, tmp_path, docker_api)
    assert summary["loss_ratio"] <= 0.6
    for worker in summary["workers"].values():
        assert worker["rounds_completed"] == JOB_DEFAULTS["lenet"]["rounds"]  # 10
        # Every status is one batch of the worker's 600 samples.
        assert all(round_["samples"] == 600 * round_["batches"] for round_ in worker["rounds"])


def test_masked_lm_job_through_worker_configs_shim_entry(
    cpu_image: str, job_base: Path, tmp_path: Path, docker_api: Any
) -> None:
    """A BERT masked-LM job as upstream's data docs prepare text: slices of input_ids and
    attention_mask, no labels, the tokenizer in the model artifact; the executor masks."""
    summary = run_through_worker_configs_shim_entry("bert-mlm", job_base, tmp_path, docker_api)
    assert summary["loss_ratio"] <= 0.8
