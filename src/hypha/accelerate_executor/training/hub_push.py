"""`push-to-hub{repository, token}`: the trained model's folder (model_export.py) uploaded to
a Hugging Face repository with `huggingface_hub`, which reads the Hub's address from
HF_ENDPOINT (default https://huggingface.co). The repository is created if it is missing,
private (our choice: a trained model is not the world's until its owner says so), and the
folder is committed to it in one commit.

The token goes into the client's Authorization header only: never into a message, since the
scheduler's `error{other}` line and the worker's log are read by others. A failure is a
PushError whose one line names the repository and what the Hub said.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path

from hypha.accelerate_executor.errors import PushError

COMMIT_MESSAGE = "Trained with Hypha (DiLoCo)"
# Set by the shim in a container without network: the Unix socket on which the shim takes
# the upload over and does it from the host (shim/hub_upload.py).
SOCKET_VARIABLE = "HYPHA_HUB_SOCKET"
PUSH_ROUTE = "/push"


def push(folder: Path, repository: str, token: str) -> str:
    """Uploads `folder` to `repository`: through the shim when it offers (a container has no
    network), else from here. The commit's URL; PushError with one line when it failed."""
    socket_path = os.environ.get(SOCKET_VARIABLE)
    if socket_path:
        return push_through_shim(Path(socket_path), folder, repository, token)
    return push_folder(folder, repository, token)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path) -> None:
        super().__init__("hub-upload")  # the shim answers whatever host is named
        self._socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self._socket_path))


def push_through_shim(socket_path: Path, folder: Path, repository: str, token: str) -> str:
    """Asks the shim to upload `folder` (in the work dir, which the host sees at the same
    path): the token travels in the request's body over a socket only the job's uid can
    open, never in an environment, an argv or a file. Waits as long as the upload takes."""
    body = json.dumps({"folder": str(folder), "repository": repository, "token": token})
    connection = _UnixConnection(socket_path)
    try:
        connection.request("POST", PUSH_ROUTE, body.encode(), {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise PushError(
            f"pushing the model to {repository} failed: the shim's upload socket "
            f"{socket_path}: {exc}"
        ) from None
    finally:
        connection.close()
    if response.status != 200:
        raise PushError(str(answer.get("error") or f"the shim answered {response.status}"))
    return str(answer.get("commit_url", ""))


def push_folder(folder: Path, repository: str, token: str) -> str:
    """Uploads every file in `folder` to `repository`; the commit's URL."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # a bar per file is noise in a worker's log
    api = HfApi(token=token)
    try:
        api.create_repo(repository, private=True, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repository, folder_path=folder, commit_message=COMMIT_MESSAGE
        )
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise PushError(_line(repository, f"the Hub answered {status}", exc, token)) from None
    except (httpx2.HTTPError, OSError, ValueError) as exc:
        raise PushError(_line(repository, type(exc).__name__, exc, token)) from None
    return str(commit.commit_url)


def _line(repository: str, what: str, exc: Exception, token: str) -> str:
    """One line with no trace of the token; the Hub's own text cut at 300 characters."""
    text = " ".join(str(exc).split())
    if token:
        text = text.replace(token, "<token>")
    return f"pushing the model to {repository} failed: {what}: {text[:300]}"
