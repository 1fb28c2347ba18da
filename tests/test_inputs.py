"""Model inputs from a slice's tensors: the preprocessor called with keywords named by its
input-names and merged with the other tensors, labels for causal-lm from input_ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoImageProcessor, PreTrainedTokenizerFast

from hypha.accelerate_executor.errors import DataError
from hypha.accelerate_executor.inputs import ModelInputs, slice_names
from hypha.accelerate_executor.job import TrainConfig, parse_job

JOB = Path(__file__).parent / "data" / "job-causal-lm.json"
LENET = Path(__file__).parent / "lenet"


def config(**changes: Any) -> TrainConfig:
    raw = json.loads(JOB.read_text())
    raw["executor"]["config"].pop("preprocessor", None)
    raw["executor"]["config"].update(changes)
    return parse_job(json.dumps(raw)).config


def image_config() -> TrainConfig:
    artifact = {"type": "uri", "value": "https://example.org/preprocessor_config.json"}
    return config(
        model={"task": "image-classification", "artifact": artifact,
               "input-names": ["pixel_values", "labels"]},
        preprocessor={"task": "image", "artifact": artifact, "input-names": ["images"]},
    )  # fmt: skip


def test_the_image_processor_gets_images_by_keyword_and_labels_pass_through() -> None:
    processor = AutoImageProcessor.from_pretrained(LENET)  # normalises with mean 0.5, std 0.5
    images = torch.rand(5, 1, 28, 28)
    labels = torch.arange(5)
    inputs = ModelInputs(image_config(), processor)({"images": images, "labels": labels})
    assert sorted(inputs) == ["labels", "pixel_values"]
    torch.testing.assert_close(inputs["pixel_values"], (images - 0.5) / 0.5)
    assert torch.equal(inputs["labels"], labels)
    assert slice_names(image_config()) == (["images"], ("pixel_values", "labels", "attention_mask"))


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocabulary = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3, "again": 4}
    backend = Tokenizer(WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


def test_a_tokenizer_gets_the_texts_by_keyword_and_causal_lm_labels_mask_padding() -> None:
    artifact = {"type": "uri", "value": "https://example.org/tokenizer.json"}
    spec = config(preprocessor={"task": "tokenizer", "artifact": artifact, "input-names": ["text"]})
    rows = torch.zeros(2, 24, dtype=torch.uint8)
    for row, text in enumerate([b"hello world again", b"hello"]):
        rows[row, : len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    inputs = ModelInputs(spec, tiny_tokenizer())({"text": rows})
    assert inputs["input_ids"].tolist() == [[2, 3, 4], [2, 0, 0]]
    assert inputs["labels"].tolist() == [[2, 3, 4], [2, -100, -100]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_language_slices_without_labels_train_causal_lm() -> None:
    spec = config()  # causal-lm, input-names input_ids and labels, no preprocessor
    assert slice_names(spec) == (["input_ids"], ("labels", "attention_mask"))
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    inputs = ModelInputs(spec)({"input_ids": ids, "attention_mask": mask})
    assert inputs["labels"].tolist() == [[5, 6, 7], [8, 9, -100]]
    assert torch.equal(inputs["attention_mask"], mask)
    given = torch.full_like(ids, 3)  # labels in the slice are used as they are
    assert torch.equal(ModelInputs(spec)({"input_ids": ids, "labels": given})["labels"], given)


def test_an_input_name_nothing_provides_is_named() -> None:
    spec = config(model={**config().model.model_dump(by_alias=True), "task": "masked-lm"})
    with pytest.raises(DataError, match="input-names labels are not in the batch; it holds"):
        ModelInputs(spec)({"input_ids": torch.ones(2, 3, dtype=torch.int64)})
