"""From a job's task names to transformers classes, and loading what the bridge fetched."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import transformers

from hypha.accelerate_executor.errors import JobSpecError, RemoteCodeRefused
from hypha.accelerate_executor.protocol.tasks import trains

# transformers 5 folded Vision2Seq into ImageTextToText; older releases have both.
_RENAMED = {"AutoModelForVision2Seq": "AutoModelForImageTextToText"}

_PREPROCESSOR_CLASSES = {
    "tokenizer": "AutoTokenizer",
    "feature": "AutoFeatureExtractor",
    "image": "AutoImageProcessor",
    "video": "AutoVideoProcessor",
    "auto": "AutoProcessor",
}


def _transformers_class(name: str, what: str) -> Any:
    cls = getattr(transformers, name, None) or getattr(transformers, _RENAMED.get(name, ""), None)
    if cls is None:
        raise JobSpecError(
            f"{what} needs transformers.{name}, which this transformers does not have"
        )
    return cls


def _refuse_untrusted_code(folder: Path, config_file: str, what: str, trusted: bool) -> None:
    try:
        ships_code = "auto_map" in json.loads((folder / config_file).read_text())
    except (OSError, ValueError, TypeError):
        return  # transformers will say what is wrong with the file
    if ships_code and not trusted:
        raise RemoteCodeRefused(
            f"the {what} ships its own Python code ({config_file} has an auto_map); "
            "set HYPHA_TRUST_REMOTE_CODE=1 to allow it"
        )


def load_model(
    task: str, folder: Path, trust_remote_code: bool = False, split: Any = None
) -> torch.nn.Module:
    """The task's Auto class from `folder`; remote code runs only when the operator opted in.
    With `split` (transformers' DistributedConfig: parallelism.sharded_loading) the model is
    sharded as it loads, each rank reading only its part."""
    cls = _transformers_class(trains(task).auto_class, f"model task {task!r}")
    _refuse_untrusted_code(folder, "config.json", "model", trust_remote_code)
    transformers.utils.logging.disable_progress_bar()  # a bar per load is noise in a worker's log
    sharding = {} if split is None else {"distributed_config": split}
    model: torch.nn.Module = cls.from_pretrained(
        folder, trust_remote_code=trust_remote_code, dtype=torch.float32, **sharding
    )
    if trains(task).labels == "contrastive":
        # CLIP-like models compute their loss only when asked, and a slice holds tensors
        # only: the flag is bound here, which every wrapper's forward call goes through.
        model.forward = functools.partial(model.forward, return_loss=True)
    return model


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer shipped with the model artifact (a masked-lm job's mask token)."""
    try:
        return transformers.AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, TypeError) as exc:
        raise JobSpecError(
            "masked-lm makes its labels with the tokenizer's mask token: ship the tokenizer "
            "files with the model artifact or name a tokenizer preprocessor "
            f"({' '.join(str(exc).split())[:200]})"
        ) from None


def load_preprocessor(task: str, folder: Path, trust_remote_code: bool = False) -> Any:
    cls = _transformers_class(_PREPROCESSOR_CLASSES[task], f"preprocessor task {task!r}")
    for config_file in ("preprocessor_config.json", "tokenizer_config.json"):
        _refuse_untrusted_code(folder, config_file, "preprocessor", trust_remote_code)
    return cls.from_pretrained(folder, trust_remote_code=trust_remote_code)
