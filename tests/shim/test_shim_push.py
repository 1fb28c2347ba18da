"""push-to-hub through the shim: a real action-era job in the cpu image, as the non-root
worker uid with container network `none`, pushed by the shim from the host to the loopback
Hub stand-in (standin/hub.py), the final model also kept in the operator's HYPHA_MODEL_DIR.
The scheduler's token is looked for, and never found, in every process's argv, in
`docker inspect` of the job's container, in the job's output and in the work dir's files."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.platform.image_tags import image_tags
from shim_harness import WORKER_GID, WORKER_UID

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TOKEN = "hf_pushThroughTheShimSecret0123456789"
REPOSITORY = "hypha-test/pushed-by-the-shim"


def without_version(text: bytes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(text)
    document.pop("transformers_version", None)
    return document


@pytest.fixture
def base(work_base: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir=work_base))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_push_to_hub_through_the_shim_from_a_container_without_network(
    docker_api: Any, base: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load

    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
    from hypha.standin.data_service.assets import AssetSpec, build_model, ensure_assets
    from hypha.standin.hub import HubStandin
    from hypha.standin.worker.executor_entries import preset
    from hypha.standin.worker.worker import LocalWorker, serve_one_job

    assert any(docker_api.images(name=tag) for tag in image_tags("cpu")), "no cpu image"
    kept = tmp_path / "kept"
    options = RunOptions(workers=1, rounds=1, steps_per_round=3)
    catalog = Catalog.from_assets(ensure_assets(tmp_path / "assets", options.asset_spec()))
    inspected: list[dict[str, Any]] = []
    argv_lines: list[str] = []
    done = threading.Event()

    def watch() -> None:
        """The job's container as `docker inspect` shows it, and every process's argv."""
        while not done.is_set():
            for container in docker_api.containers(filters={"label": "hypha.accelerate.work-dir"}):
                if container["Labels"]["hypha.accelerate.work-dir"].startswith(f"{base}/"):
                    inspected.append(docker_api.inspect_container(container["Id"]))
            ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True)
            argv_lines.extend(ps.stdout.splitlines())
            time.sleep(0.3)

    with (
        HubStandin(TOKEN) as hub,
        build_coordinator(catalog, options, push_destination=(REPOSITORY, TOKEN)) as coordinator,
    ):
        worker = LocalWorker(
            "w1",
            preset("shim"),
            base,
            owner=(WORKER_UID, WORKER_GID),
            keep_work_dir=True,  # its files are searched for the token below
            env={
                "HF_ENDPOINT": hub.url,  # the shim's environment: the upload is the host's
                "HF_HUB_DISABLE_XET": "1",  # the stand-in speaks basic LFS only
                "HYPHA_MODEL_DIR": str(kept),
            },
        )
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            code = serve_one_job(CoordinatorClient(coordinator.url), worker)
        finally:
            done.set()
            watcher.join()
        assert coordinator.actions is not None and coordinator.actions.push_done
        record = coordinator.summary()["workers"]["w1"]
    output = capfd.readouterr()
    assert code == 0, output
    assert record["metrics"], record  # it trained
    # The container ran as the worker's uid, without network.
    assert inspected, "the job's container was never seen"
    config = inspected[0]
    assert config["Config"]["User"] == f"{WORKER_UID}:{WORKER_GID}"
    assert config["HostConfig"]["NetworkMode"] == "none"
    # What arrived: save_pretrained's files for the final weights, kept alike on the host.
    files = hub.repos[REPOSITORY].files
    assert set(files) == {"config.json", "generation_config.json", "model.safetensors"}
    model = build_model(AssetSpec())
    model.load_state_dict(load(files["model.safetensors"]), strict=False)
    model.tie_weights()
    model.save_pretrained(tmp_path / "reference")
    (job_kept,) = kept.iterdir()
    for name, data in files.items():
        assert data == (job_kept / name).read_bytes(), name
        reference = (tmp_path / "reference" / name).read_bytes()
        if name.endswith(".json"):
            # The image's transformers may be another release than this venv's: the one
            # field that may differ is the version save_pretrained writes.
            data, reference = (without_version(text) for text in (data, reference))
        assert data == reference, name
    assert "pushed the model to" in output.out
    # The token: in no argv, no `docker inspect`, no output line, no file of the work dir.
    assert not [line for line in argv_lines if TOKEN in line]
    assert all(TOKEN not in json.dumps(seen) for seen in inspected)
    assert TOKEN not in output.out and TOKEN not in output.err
    work_files = [path for path in base.rglob("*") if path.is_file()]
    assert work_files, "the work dir was kept"
    assert [path for path in work_files if TOKEN.encode() in path.read_bytes()] == []
