"""`push-to-hub{repository, token}`: the trained model's folder (model_export.py) uploaded to
a Hugging Face repository with `huggingface_hub`, which reads the Hub's address from
HF_ENDPOINT (default https://huggingface.co). As upstream's executor does, the repository
is created if it is missing (private: a trained model is the network's, not the world's
until its owner says so) and the folder is committed to it in one commit.

The token goes into the client's Authorization header only: never into a message, since the
scheduler's `error{other}` line and the worker's log are read by others. A failure is a
PushError whose one line names the repository and what the Hub said.
"""

from __future__ import annotations

from pathlib import Path

from hypha.accelerate_executor.errors import PushError

COMMIT_MESSAGE = "Trained with Hypha (DiLoCo)"


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
