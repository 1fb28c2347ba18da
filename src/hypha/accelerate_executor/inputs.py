"""From a slice's tensors to the model's keyword arguments, as upstream's executor builds them.

With a preprocessor, the processor is called with keywords named by its input-names
(`processor(images=...)`, `tokenizer(text=...)`) and its outputs are merged with the slice's
other tensors. A causal-lm job whose data holds no `labels` (language slices carry
`input_ids` and `attention_mask`) learns from `input_ids`, padding masked out with -100.
The model gets its input-names, plus `attention_mask` when there is one.
"""

from __future__ import annotations

from typing import Any

import torch

from hypha.accelerate_executor.data import IGNORED_LABEL, Batch
from hypha.accelerate_executor.errors import DataError
from hypha.accelerate_executor.job import TrainConfig

ATTENTION_MASK = "attention_mask"


def derives_labels(config: TrainConfig) -> bool:
    """Whether `labels` may come from `input_ids` when the data holds none."""
    return config.model.task == "causal-lm" and "labels" in config.model.input_names


def slice_names(config: TrainConfig) -> tuple[list[str], tuple[str, ...]]:
    """The tensors every slice must hold, and those taken when a slice holds them."""
    model_names = list(config.model.input_names)
    if config.preprocessor is not None:
        raw = list(config.preprocessor.input_names)
        return raw, (*model_names, ATTENTION_MASK)
    required = [n for n in model_names if not (n == "labels" and derives_labels(config))]
    return required, ("labels", ATTENTION_MASK) if derives_labels(config) else (ATTENTION_MASK,)


class ModelInputs:
    """Builds one batch's model inputs; the preprocessor, if any, is loaded already."""

    def __init__(self, config: TrainConfig, processor: Any = None) -> None:
        self._model_names = list(config.model.input_names)
        self._spec = config.preprocessor
        self._processor = processor
        self._derive_labels = derives_labels(config)

    def __call__(self, batch: Batch) -> Batch:
        if self._spec is not None:
            raw = {name: batch[name] for name in self._spec.input_names}
            if self._spec.task == "tokenizer":
                encoded = self._processor(
                    **{name: _texts(tensor) for name, tensor in raw.items()},
                    padding=True,
                    truncation=True,
                    return_tensors="pt",
                )
            else:
                encoded = self._processor(**raw, return_tensors="pt")
            rest = {name: tensor for name, tensor in batch.items() if name not in raw}
            batch = {**rest, **{name: torch.as_tensor(value) for name, value in encoded.items()}}
        if self._derive_labels and "labels" not in batch and "input_ids" in batch:
            labels = batch["input_ids"].clone()
            if ATTENTION_MASK in batch:
                labels[batch[ATTENTION_MASK] == 0] = IGNORED_LABEL  # padding teaches nothing
            batch = {**batch, "labels": labels}
        missing = [name for name in self._model_names if name not in batch]
        if missing:
            raise DataError(
                f"the model's input-names {', '.join(missing)} are not in the batch; "
                f"it holds {', '.join(sorted(batch))}"
            )
        wanted = {*self._model_names, ATTENTION_MASK}
        return {name: tensor for name, tensor in batch.items() if name in wanted}


def _texts(rows: torch.Tensor) -> list[str]:
    """Text travels in a slice as UTF-8 bytes, one zero-padded uint8 row per sample."""
    return [bytes(row.tolist()).rstrip(b"\0").decode("utf-8", "replace") for row in rows]
