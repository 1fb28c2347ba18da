"""Model inputs from a slice's tensors: the preprocessor called with keywords named by its
input-names and merged with the other tensors, labels for causal-lm from input_ids."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoImageProcessor, PreTrainedTokenizerFast

from hypha.accelerate_executor.errors import DataError, JobSpecError
from hypha.accelerate_executor.protocol.alpha17.job import TrainConfig, parse_job
from hypha.accelerate_executor.training.inputs import (
    MaskedLanguageModelling,
    ModelInputs,
    slice_names,
)
from repo_paths import TESTS

JOB = TESTS / "data" / "job-causal-lm.json"
LENET = TESTS / "lenet"


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


def model_config(task: str, input_names: list[str]) -> TrainConfig:
    model = config().model.model_dump(by_alias=True)
    return config(model={**model, "task": task, "input-names": input_names})


def test_an_input_name_nothing_provides_is_named() -> None:
    spec = model_config("sequence-classification", ["input_ids", "labels"])
    with pytest.raises(DataError, match="input-names labels are not in the batch; it holds"):
        ModelInputs(spec)({"input_ids": torch.ones(2, 3, dtype=torch.int64)})


def test_causal_lm_makes_labels_when_input_names_leave_them_out() -> None:
    spec = model_config("causal-lm", ["input_ids", "attention_mask"])
    assert slice_names(spec) == (["input_ids", "attention_mask"], ("labels",))
    ids, mask = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 0]])
    inputs = ModelInputs(spec)({"input_ids": ids, "attention_mask": mask})
    assert inputs["labels"].tolist() == [[5, 6, -100]]


def test_a_task_s_labels_reach_the_model_whether_or_not_input_names_list_them() -> None:
    spec = model_config("question-answering", ["input_ids"])
    assert slice_names(spec) == (
        ["input_ids"],
        ("start_positions", "end_positions", "attention_mask"),
    )
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.int64), "start_positions": torch.tensor([1, 2]),
             "end_positions": torch.tensor([2, 3]), "unused": torch.zeros(2)}  # fmt: skip
    assert sorted(ModelInputs(spec)(batch)) == ["end_positions", "input_ids", "start_positions"]


SPECIAL_IDS = (0, 1, 2, 3)  # pad, unk, cls, sep
MASK_ID = 4


def masking(seed: int = 7) -> MaskedLanguageModelling:
    return MaskedLanguageModelling(MASK_ID, (*SPECIAL_IDS, MASK_ID), 1000, seed)


def test_masked_lm_masks_as_bert_does() -> None:
    """15% of the tokens that are neither special nor padding are predicted: 80% of them
    shown as the mask token, 10% as a random token, 10% as they are."""
    ids = torch.randint(5, 1000, (400, 128))
    ids[:, 0], ids[:, -1] = 2, 3
    mask = torch.ones_like(ids)
    mask[::2, -30:] = 0
    out = masking()({"input_ids": ids * mask, "attention_mask": mask}, number=1)
    chosen = out["labels"] != -100
    maskable = (mask == 1) & (ids >= 5)
    assert not (chosen & ~maskable).any()  # never a special token or padding
    assert torch.equal(out["labels"][chosen], ids[chosen])
    assert torch.equal(out["input_ids"][~chosen], (ids * mask)[~chosen])
    share = chosen.sum() / maskable.sum()
    masked = (out["input_ids"][chosen] == MASK_ID).float().mean()
    unchanged = (out["input_ids"][chosen] == ids[chosen]).float().mean()
    assert abs(share - 0.15) < 0.005 and abs(masked - 0.8) < 0.01
    assert abs(unchanged - 0.1) < 0.01  # (a random token may also draw the same one)


def test_masking_repeats_for_the_same_seed_and_batch_and_differs_otherwise() -> None:
    batch = {"input_ids": torch.randint(5, 1000, (8, 64))}
    first = masking(seed=7)(batch, number=3)
    assert torch.equal(first["input_ids"], masking(seed=7)(batch, number=3)["input_ids"])
    assert not torch.equal(first["labels"], masking(seed=7)(batch, number=4)["labels"])
    assert not torch.equal(first["labels"], masking(seed=8 << 32)(batch, number=3)["labels"])


def test_masked_lm_labels_in_the_slice_are_used_as_they_are() -> None:
    spec = model_config("masked-lm", ["input_ids"])
    ids, given = torch.randint(5, 100, (2, 6)), torch.full((2, 6), -100)
    inputs = ModelInputs(spec, masking=masking())({"input_ids": ids, "labels": given})
    assert torch.equal(inputs["input_ids"], ids) and torch.equal(inputs["labels"], given)


def test_masked_lm_without_a_mask_token_is_refused_in_one_line() -> None:
    with pytest.raises(JobSpecError, match=r"^masked-lm: the tokenizer has no mask token"):
        MaskedLanguageModelling.from_tokenizer(tiny_tokenizer(), seed=0)
