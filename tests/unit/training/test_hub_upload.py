"""The shim's host-side upload (shim/hub_upload.py) as the executor in a container reaches it:
real HTTP over the real Unix socket in a work dir, the real `huggingface_hub` client
uploading from the shim's side to the loopback Hub stand-in."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypha.accelerate_executor.errors import PushError
from hypha.accelerate_executor.shim.hub_upload import HubUpload
from hypha.accelerate_executor.training.hub_push import push_through_shim
from hypha.standin.hub import HubStandin

TOKEN = "hf_standin_token_for_the_shim_0123"
REPOSITORY = "hypha-test/through-the-shim"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    import huggingface_hub.constants

    with HubStandin(TOKEN) as standin:
        # The shim's own environment says where the Hub is; huggingface_hub read it at import.
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", standin.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
        yield standin


@pytest.fixture
def upload(short_tmp: Path) -> Iterator[HubUpload]:
    served = HubUpload(str(short_tmp), (os.getuid(), os.getgid()))
    served.start()
    yield served
    served.stop()


def model_folder(work_dir: Path) -> Path:
    folder = work_dir / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}\n')
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    return folder


def test_the_shim_uploads_the_folder_and_only_the_jobs_uid_can_connect(
    hub: HubStandin, upload: HubUpload, short_tmp: Path
) -> None:
    folder = model_folder(short_tmp)
    socket_mode = stat.S_IMODE(os.stat(upload.socket_path).st_mode)
    assert socket_mode == 0o600
    url = push_through_shim(Path(upload.socket_path), folder, REPOSITORY, TOKEN)
    assert url.startswith(f"{hub.url}/{REPOSITORY}/commit/")
    files = hub.repos[REPOSITORY].files
    assert files == {
        name: (folder / name).read_bytes() for name in ("config.json", "model.safetensors")
    }


def test_a_wrong_token_is_one_line_without_the_token(
    hub: HubStandin, upload: HubUpload, short_tmp: Path
) -> None:
    wrong = "hf_wrong_token_never_in_a_line_987"
    with pytest.raises(PushError) as caught:
        push_through_shim(Path(upload.socket_path), model_folder(short_tmp), REPOSITORY, wrong)
    line = str(caught.value)
    assert line.startswith(f"pushing the model to {REPOSITORY} failed: the Hub answered 401")
    assert "\n" not in line and wrong not in line
    assert hub.refused == 1 and not hub.repos


def test_a_link_out_of_the_work_dir_is_never_followed(
    hub: HubStandin, upload: HubUpload, short_tmp: Path, tmp_path: Path
) -> None:
    """The container writes the folder: a link in it must not make the host upload a file
    of the host's."""
    secret = tmp_path / "host-secret"
    secret.write_text("the host's own file\n")
    folder = model_folder(short_tmp)
    (folder / "stolen.txt").symlink_to(secret)
    push_through_shim(Path(upload.socket_path), folder, REPOSITORY, TOKEN)
    assert set(hub.repos[REPOSITORY].files) == {"config.json", "model.safetensors"}
    # And a folder that is itself a link out of the work dir is refused.
    (short_tmp / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(PushError, match="is not a folder inside the work dir"):
        push_through_shim(Path(upload.socket_path), short_tmp / "elsewhere", REPOSITORY, TOKEN)
