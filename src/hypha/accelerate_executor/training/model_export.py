"""The trained model as a Hugging Face folder: what `save_pretrained` writes (config.json,
model.safetensors, tied weights as save_pretrained handles them, generation_config.json
where the model has one) plus the tokenizer or processor files the job's model artifact came
with, so that `from_pretrained` on the folder (or the Hub repository it is pushed to) gives
the trained model ready to use.

The weights written are theta_global, the round's agreed model (diloco.GlobalWeights), never
a rank's local drift. Rank 0 writes the folder. Where the model is sharded no rank holds
theta_global whole: every rank has written its part of the weights' file already
(GlobalWeights.write_model), and the folder takes that file with the config save_pretrained
would write.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hypha.accelerate_executor.errors import ModelExportError

if TYPE_CHECKING:
    import torch

# What save_pretrained writes, or an artifact's weights in another form: never copied over
# from the artifact, since the trained weights replace them.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
_WEIGHT_INDEXES = (".index.json",)


def write_hf_folder(
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    aliases: dict[str, str],
    artifacts: Path,
    destination: Path,
    weights_file: Path | None = None,
) -> list[str]:
    """Writes `model`'s config with `weights` (theta_global, by canonical name; `aliases`
    maps every state-dict name to its canonical one) as save_pretrained does, or with the
    safetensors file `weights_file` (moved in as model.safetensors), then copies
    the artifact's other files (tokenizer, processor) beside them. Returns the file names
    written, sorted. Files already in `destination` under those names are overwritten, and
    nothing else there is touched (it may be a directory the operator keeps other things in)."""
    try:
        return _write(model, weights, aliases, artifacts, destination, weights_file)
    except OSError as exc:
        raise ModelExportError(
            f"writing the model to {destination} failed: {exc.strerror or exc}"
        ) from None


def _write(
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    aliases: dict[str, str],
    artifacts: Path,
    destination: Path,
    weights_file: Path | None,
) -> list[str]:
    destination.mkdir(parents=True, exist_ok=True)
    # Written beside, then moved in: the names save_pretrained chose are what is listed.
    staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=destination))
    try:
        # Every name the model's own state dict has, tied ones pointing at their canonical
        # tensor: save_pretrained then drops the tied copies itself, as from the model.
        state = {
            name: weights[canonical] for name, canonical in aliases.items() if canonical in weights
        }
        if weights_file is None:
            model.save_pretrained(staging, state_dict=state)  # type: ignore[operator]
        else:
            model.config.save_pretrained(staging)  # type: ignore[union-attr,operator]
            generation = getattr(model, "generation_config", None)
            if generation is not None:
                generation.save_pretrained(staging)
            os.replace(weights_file, staging / "model.safetensors")
        for source in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
            if (
                source.is_file()
                and not (staging / source.name).exists()
                and not _is_weights(source.name)
            ):
                shutil.copyfile(source, staging / source.name)
        written = sorted(path.name for path in staging.iterdir())
        for name in written:
            os.replace(staging / name, destination / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _is_weights(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES) or name.endswith(_WEIGHT_INDEXES)
