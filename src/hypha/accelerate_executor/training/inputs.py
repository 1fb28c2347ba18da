"""From a slice's tensors to the model's keyword arguments, as upstream's executor builds them,
with the labels the job's task forms (tasks.py).

With a preprocessor, the processor is called with keywords named by its input-names
(`processor(images=...)`, `tokenizer(text=...)`) and its outputs are merged with the slice's
other tensors. The model gets its input-names, `attention_mask` when there is one, and its
task's labels: those the slice holds, as they are; otherwise, for a language model, those its
task makes from `input_ids` on the batch's device (causal: the tokens themselves, padding at
-100; masked: BERT's masking).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hypha.accelerate_executor.errors import DataError, JobSpecError
from hypha.accelerate_executor.protocol.generation import AnyJob, AnyTrainConfig
from hypha.accelerate_executor.protocol.tasks import trains
from hypha.accelerate_executor.training.data import IGNORED_LABEL, Batch

ATTENTION_MASK = "attention_mask"
LABELS = "labels"
# BERT's masking: of the tokens that may be masked, MASKED_SHARE are chosen; of those, 80%
# become the mask token, 10% a random token and 10% stay, and only they are predicted.
MASKED_SHARE = 0.15
TO_MASK_TOKEN = 0.8
TO_RANDOM_TOKEN = 0.5  # of those not turned into the mask token: half of the other 20%


def derives_labels(config: AnyTrainConfig) -> bool:
    """Whether the task makes `labels` from `input_ids` when the slice holds none."""
    return trains(config.model.task).labels in ("causal", "masked")


def slice_names(config: AnyTrainConfig) -> tuple[list[str], tuple[str, ...]]:
    """The tensors every slice must hold, and those taken when a slice holds them."""
    taken = (*config.model.input_names, *trains(config.model.task).label_names, ATTENTION_MASK)
    if config.preprocessor is not None:
        return list(config.preprocessor.input_names), tuple(dict.fromkeys(taken))
    derived = {LABELS} if derives_labels(config) else set()
    required = [name for name in config.model.input_names if name not in derived]
    return required, tuple(name for name in dict.fromkeys(taken) if name not in required)


@dataclass(frozen=True)
class MaskedLanguageModelling:
    """What BERT's masking needs from the tokenizer, and the seed that makes it repeatable."""

    mask_token_id: int
    special_ids: tuple[int, ...]
    vocabulary_size: int
    seed: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, seed: int) -> MaskedLanguageModelling:
        if getattr(tokenizer, "mask_token_id", None) is None:
            raise JobSpecError(
                "masked-lm: the tokenizer has no mask token, so no labels can be made; "
                "give one with a mask token, or slices that hold labels"
            )
        return cls(tokenizer.mask_token_id, tuple(tokenizer.all_special_ids), len(tokenizer), seed)

    def __call__(self, batch: Batch, number: int) -> Batch:
        """`input_ids` masked and the `labels` that go with them, for the `number`th batch
        this process makes: the same seed, number and rank give the same mask."""
        ids = batch["input_ids"]
        generator = torch.Generator(ids.device).manual_seed(self.seed + number)
        maskable = ~torch.isin(ids, torch.tensor(self.special_ids, device=ids.device))
        if ATTENTION_MASK in batch:
            maskable &= batch[ATTENTION_MASK].bool()
        draw = torch.rand((3, *ids.shape), generator=generator, device=ids.device)
        chosen = maskable & (draw[0] < MASKED_SHARE)
        to_mask = chosen & (draw[1] < TO_MASK_TOKEN)
        to_random = chosen & ~to_mask & (draw[2] < TO_RANDOM_TOKEN)
        random_ids = torch.randint(
            self.vocabulary_size, ids.shape, generator=generator, device=ids.device
        )
        masked = torch.where(to_mask, self.mask_token_id, torch.where(to_random, random_ids, ids))
        labels = torch.where(chosen, ids, IGNORED_LABEL)
        return {**batch, "input_ids": masked, LABELS: labels}


def causal_labels(batch: Batch) -> torch.Tensor:
    labels = batch["input_ids"].clone()
    if ATTENTION_MASK in batch:
        labels[batch[ATTENTION_MASK] == 0] = IGNORED_LABEL  # padding teaches nothing
    return labels


class ModelInputs:
    """Builds one batch's model inputs on `device`; the preprocessor, if any, is loaded."""

    def __init__(
        self,
        config: AnyTrainConfig,
        processor: Any = None,
        device: torch.device | str = "cpu",
        masking: MaskedLanguageModelling | None = None,
    ) -> None:
        task = trains(config.model.task)
        self._model_names = list(config.model.input_names)
        self._wanted = {*self._model_names, *task.label_names, ATTENTION_MASK}
        self._spec = config.preprocessor
        self._processor = processor
        self._device = device
        self._rule = task.labels
        if self._rule == "masked" and masking is None:
            raise JobSpecError("masked-lm needs the tokenizer's mask token to make labels")
        self._masking = masking
        self._made = 0

    @classmethod
    def for_job(
        cls, job: AnyJob, processor: Any, artifacts: Path, device: torch.device, rank: int
    ) -> ModelInputs:
        """The job's inputs on this rank; a masked-lm job's tokenizer is its `tokenizer`
        preprocessor, or the one shipped with the model artifact."""
        masking = None
        if trains(job.config.model.task).labels == "masked":
            from hypha.accelerate_executor.training.modeling import load_tokenizer

            spec = job.config.preprocessor
            tokenizer = (
                processor if spec and spec.task == "tokenizer" else load_tokenizer(artifacts)
            )
            # Each rank masks its own share differently; a job's masks repeat run to run.
            seed = zlib.crc32(job.job_id.encode()) + (rank << 32)
            masking = MaskedLanguageModelling.from_tokenizer(tokenizer, seed)
        return cls(job.config, processor, device, masking)

    def __call__(self, batch: Batch) -> Batch:
        if self._spec is not None:
            batch = self._preprocess(batch)
        missing = [name for name in self._model_names if name not in batch]
        if missing and not (missing == [LABELS] and self._derives(batch)):
            raise DataError(
                f"the model's input-names {', '.join(missing)} are not in the batch; "
                f"it holds {', '.join(sorted(batch))}"
            )
        batch = {
            name: tensor.to(self._device, non_blocking=True)
            for name, tensor in batch.items()
            if name in self._wanted
        }
        if self._derives(batch):
            self._made += 1
            if self._masking is not None:
                return self._masking(batch, self._made)
            return {**batch, LABELS: causal_labels(batch)}
        return batch

    def _derives(self, batch: Batch) -> bool:
        return self._rule in ("causal", "masked") and LABELS not in batch and "input_ids" in batch

    def _preprocess(self, batch: Batch) -> Batch:
        assert self._spec is not None
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
        return {**rest, **{name: torch.as_tensor(value) for name, value in encoded.items()}}


def _texts(rows: torch.Tensor) -> list[str]:
    """Text travels in a slice as UTF-8 bytes, one zero-padded uint8 row per sample."""
    return [bytes(row.tolist()).rstrip(b"\0").decode("utf-8", "replace") for row in rows]
