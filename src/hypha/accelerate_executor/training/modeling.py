"""From a job's task names to transformers classes, and loading what the bridge fetched."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import transformers

from hypha.accelerate_executor.errors import (
    JobSpecError,
    NoGradientCheckpointing,
    RemoteCodeRefused,
)
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


def checkpoint_activations(model: torch.nn.Module, asked: bool, by_fsdp: bool) -> str | None:
    """Activations recomputed in the backward pass instead of kept, where `asked`
    (HYPHA_GRADIENT_CHECKPOINTING) or done `by_fsdp` (the accelerate config's
    fsdp_activation_checkpointing, which accelerate applies itself as it prepares the model);
    returns by whom, or None. Raises NoGradientCheckpointing where asked of a model that has
    none."""
    if by_fsdp:
        # A block checkpointed twice is recomputed twice over, and saves nothing more.
        return "accelerate's FSDP" + (", not HYPHA_GRADIENT_CHECKPOINTING as well" if asked else "")
    if not asked:
        return None
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise NoGradientCheckpointing(
            f"HYPHA_GRADIENT_CHECKPOINTING is on, and {type(model).__name__} has no gradient "
            "checkpointing (supports_gradient_checkpointing is not True); unset it"
        )
    # Non-reentrant, as torch recommends: the reentrant form gives a block whose inputs need
    # no gradient (the embeddings' output of a frozen table) none, and needs DDP's static graph.
    kwargs = {"use_reentrant": False}
    pretrained: Any = model
    if hasattr(pretrained, "activation_checkpointing_enable"):  # its name since 5.x
        pretrained.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        pretrained.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return "transformers' gradient checkpointing"


def checkpointed_blocks(model: torch.nn.Module) -> int:
    """The modules whose activations are recomputed: those accelerate wrapped for FSDP, and
    those transformers' flag is on in (not the model's own, which only passes it on)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return sum(
        isinstance(module, CheckpointWrapper)
        or (
            getattr(module, "gradient_checkpointing", False) is True
            and not isinstance(module, transformers.PreTrainedModel)
        )
        for module in model.modules()
    )


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
