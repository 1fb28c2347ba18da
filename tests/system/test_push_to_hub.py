"""push-to-hub end to end, natively: two real executors train the tiny GPT-2 for one round
with the stand-in's scheduler playing `model_destination`, and the real `huggingface_hub`
client pushes to the loopback Hub stand-in (standin/hub.py).

w1 talks to a Hub that knows another token: its push is refused (401), it reports
`error{other}` with one line, and the scheduler asks the next worker, w2, whose Hub takes
the token. w2's statuses after the final round wait until w1 has been asked, so the
refusal always comes first. What arrived is compared byte for byte with what
`save_pretrained` writes for the same weights, and with the final model w1 kept in its
HYPHA_MODEL_DIR: one theta_global, the same on both workers."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hypha.standin.coordinator.client import CoordinatorClient, JobBackend
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import AssetSpec, build_model, ensure_assets
from hypha.standin.hub import HubStandin
from hypha.standin.worker.executor_entries import preset
from hypha.standin.worker.worker import LocalWorker, serve_one_job

pytestmark = pytest.mark.slow
TOKEN = "hf_standin_right_token_0123456789"
REPOSITORY = "hypha-test/tiny-gpt2"


class Watched:
    """A job's way to the coordinator that shows each action-era status to `before` first."""

    def __init__(self, backend: JobBackend, before: Callable[[dict[str, Any]], None]) -> None:
        self._backend = backend
        self._before = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def action(self, request: dict[str, Any]) -> dict[str, Any]:
        self._before(request["status"]["details"])
        return self._backend.action(request)


def test_the_final_model_is_pushed_and_a_refused_push_asks_the_next_worker(
    tmp_path: Path, short_tmp: Path
) -> None:
    options = RunOptions(workers=2, rounds=1, steps_per_round=4)
    catalog = Catalog.from_assets(ensure_assets(tmp_path / "assets", options.asset_spec()))
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    kept = tmp_path / "kept"
    w1_errors: list[str] = []
    w1_done = threading.Event()
    with (
        HubStandin(TOKEN) as right_hub,
        HubStandin("hf_some_other_token") as wrong_hub,
        build_coordinator(catalog, options, push_destination=(REPOSITORY, TOKEN)) as coordinator,
    ):
        client = CoordinatorClient(coordinator.url)
        common = {"OMP_NUM_THREADS": threads, "HF_HUB_DISABLE_XET": "1"}
        w1 = LocalWorker(
            "w1",
            preset("process"),
            short_tmp,
            env={**common, "HF_ENDPOINT": wrong_hub.url, "HYPHA_MODEL_DIR": str(kept)},
        )
        w2 = LocalWorker(
            "w2", preset("process"), short_tmp, env={**common, "HF_ENDPOINT": right_hub.url}
        )

        def note_w1(details: dict[str, Any]) -> None:
            if details.get("state") == "error":
                w1_errors.append(details["message"])

        def hold_w2(details: dict[str, Any]) -> None:
            """After the final round, w2 waits until w1 has failed its push (or ended)."""
            deadline = time.monotonic() + 30
            while (
                coordinator.actions is not None
                and coordinator.actions.training_complete
                and not (w1_errors or w1_done.is_set())
                and time.monotonic() < deadline
            ):
                time.sleep(0.1)

        codes: dict[str, int] = {}

        def run(worker: LocalWorker, before: Callable[[dict[str, Any]], None]) -> None:
            backend = lambda job_id: Watched(client.backend(job_id), before)  # noqa: E731
            try:
                codes[worker.name] = serve_one_job(client, worker, backend)
            finally:
                if worker is w1:
                    w1_done.set()

        running = [
            threading.Thread(target=run, args=(w1, note_w1), daemon=True),
            threading.Thread(target=run, args=(w2, hold_w2), daemon=True),
        ]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(600)
        assert coordinator.actions is not None and coordinator.actions.push_done
    assert codes == {"w1": 0, "w2": 0}
    # w1's push was refused with one line that names the repository and not the token.
    assert wrong_hub.refused >= 1 and not wrong_hub.repos
    assert len(w1_errors) == 1, w1_errors
    assert w1_errors[0].startswith(
        f"pushing the model to {REPOSITORY} failed: the Hub answered 401"
    )
    assert "\n" not in w1_errors[0] and TOKEN not in w1_errors[0]
    # w2 pushed what save_pretrained writes (this job's artifact ships no tokenizer).
    repo = right_hub.repos[REPOSITORY]
    assert repo.private and len(repo.commits) == 1
    assert set(repo.files) == {"config.json", "generation_config.json", "model.safetensors"}
    # The bytes are save_pretrained's for the same weights, which are w1's final model too.
    from safetensors.torch import load

    model = build_model(AssetSpec())
    model.load_state_dict(load(repo.files["model.safetensors"]), strict=False)
    model.tie_weights()
    reference = tmp_path / "reference"
    model.save_pretrained(reference)
    for name in repo.files:
        assert repo.files[name] == (reference / name).read_bytes(), name
    (w1_kept,) = kept.iterdir()  # a folder named after w1's job
    for name, data in repo.files.items():
        assert (w1_kept / name).read_bytes() == data, name
