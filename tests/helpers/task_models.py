"""A tiny random-init model for every task that trains (tasks.py), and synthetic slices of the
shape its task's slices take: what the task matrix (test_tasks.py) runs through the stand-in.

Every slice holds the same few samples, so a model that learns anything from them shows it as
a falling loss within a few rounds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers as t

if TYPE_CHECKING:
    from hypha.standin.coordinator.server import Catalog

SAMPLES = 16
TOKENS = 12
VOCABULARY = 64
SPECIAL = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
_generator = torch.Generator()


def _random(*shape: int, high: int = VOCABULARY, low: int = len(SPECIAL)) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=_generator)


def _noise(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_generator)


def text(labels: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Token rows as a tokenizer makes them, [CLS] ... [SEP], the odd rows padded at the end;
    each row counts up from a random word, so that a token follows from its neighbours."""
    words = VOCABULARY - len(SPECIAL)
    ids = len(SPECIAL) + (_random(SAMPLES, 1, high=words, low=0) + torch.arange(TOKENS)) % words
    mask = torch.ones_like(ids)
    mask[1::2, -4:] = 0
    ids[:, 0] = SPECIAL["[CLS]"]
    ids[torch.arange(SAMPLES), mask.sum(1) - 1] = SPECIAL["[SEP]"]
    return {"input_ids": ids * mask, "attention_mask": mask, **(labels or {})}


def repeated_words() -> dict[str, torch.Tensor]:
    """Rows of one word each (between [CLS] and [SEP]): a masked word is any other in its row."""
    tokens = text()
    words = _random(SAMPLES, 1).expand(SAMPLES, TOKENS)
    inside = tokens["input_ids"] >= len(SPECIAL)
    return {**tokens, "input_ids": torch.where(inside, words, tokens["input_ids"])}


def next_sentences() -> dict[str, torch.Tensor]:
    """The second half of a row continues the first (label 0) or comes from elsewhere in the
    vocabulary (label 1)."""
    tokens, labels = text(), classes(2)
    half = torch.arange(TOKENS) >= TOKENS // 2
    elsewhere = _random(SAMPLES, TOKENS, low=VOCABULARY // 2)
    inside = tokens["input_ids"] >= len(SPECIAL)
    swap = half & inside & labels.bool().view(-1, 1)
    ids = torch.where(swap, elsewhere, tokens["input_ids"])
    type_ids = half.long().expand(SAMPLES, TOKENS)
    return {**tokens, "input_ids": ids, "token_type_ids": type_ids, "labels": labels}


def by_class(count: int, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Classes, and noise of `shape` per sample brightened by its class: learnable quickly."""
    labels = classes(count)
    brightness = labels.float().view(-1, *([1] * len(shape))) / count
    return labels, 0.5 * _noise(SAMPLES, *shape) + brightness


def classes(count: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, count, (SAMPLES, *shape), generator=_generator)


def bert(**extra: Any) -> t.BertConfig:
    return t.BertConfig(
        vocab_size=VOCABULARY, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, **extra,
    )  # fmt: skip


def wav2vec2(**extra: Any) -> t.Wav2Vec2Config:
    return t.Wav2Vec2Config(
        vocab_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, mask_time_prob=0.0,
        tdnn_dim=(8, 8), tdnn_kernel=(3, 1), tdnn_dilation=(1, 1), xvector_output_dim=8,
        num_labels=3, pad_token_id=0, ctc_loss_reduction="mean", **extra,
    )  # fmt: skip


def mask_token_tokenizer() -> t.PreTrainedTokenizerFast:
    """A word-level tokenizer with BERT's special tokens, shipped with the masked-lm model."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocabulary = {**SPECIAL, **{f"w{i}": i for i in range(len(SPECIAL), VOCABULARY)}}
    backend = Tokenizer(WordLevel(vocabulary, unk_token="[UNK]"))
    return t.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
    )  # fmt: skip


AUDIO = 400  # samples: 39 frames out of the tiny wav2vec2's feature encoder
AUDIO_FRAMES = 39


@dataclass(frozen=True)
class TaskCase:
    task: str
    config: Callable[[], Any]
    slices: Callable[[], dict[str, torch.Tensor]]
    input_names: tuple[str, ...]
    model: str  # the class the Auto class loads, for the closing note
    tokenizer: bool = False
    learning_rate: float = 1e-2

    def write_model(self, folder: Path) -> list[str]:
        """The model (and tokenizer) saved to `folder`; returns the files to fetch."""
        from hypha.accelerate_executor.protocol.tasks import trains
        from hypha.accelerate_executor.training.modeling import _transformers_class

        torch.manual_seed(0)
        auto = _transformers_class(trains(self.task).auto_class, self.task)
        model = auto.from_config(self.config())
        assert type(model).__name__ == self.model, type(model).__name__
        model.save_pretrained(folder)
        if self.tokenizer:
            mask_token_tokenizer().save_pretrained(folder)
        return sorted(path.name for path in folder.iterdir() if path.is_file())

    def write_slices(self, folder: Path, count: int) -> None:
        from safetensors.torch import save_file

        _generator.manual_seed(0)
        tensors = {name: tensor.contiguous() for name, tensor in self.slices().items()}
        for index in range(count):
            save_file(tensors, folder / f"{index}.safetensors")

    def write_catalog(self, root: Path, slices: int = 4) -> Catalog:
        """The model under root/models and `slices` data slices under root/data, as the
        stand-in's catalog that serves them."""
        from hypha.standin.coordinator.server import Catalog

        repository = "tasks/" + self.task
        folder = root / "models" / repository
        folder.mkdir(parents=True)
        filenames = self.write_model(folder)
        (root / "data").mkdir()
        self.write_slices(root / "data", slices)
        return Catalog(root / "models", root / "data", "synthetic", repository, tuple(filenames))

    def retarget(self, job: dict[str, Any]) -> None:
        """The stand-in's job made this case's: its task, inputs and learning rate."""
        config = job["executor"]["config"]
        config["model"].update(task=self.task, **{"input-names": list(self.input_names)})
        config["optimizer"]["learning-rate"] = self.learning_rate


def _qa() -> dict[str, torch.Tensor]:
    start = classes(TOKENS // 2)
    return text({"start_positions": start, "end_positions": start + 2})


def _captioned() -> dict[str, torch.Tensor]:
    tokens = text()
    labels = tokens["input_ids"].masked_fill(tokens["attention_mask"] == 0, -100)
    return {**tokens, "labels": labels, "pixel_values": _noise(SAMPLES, 3, 16, 16)}


def _image(size: int = 32) -> torch.Tensor:
    return _noise(SAMPLES, 3, size, size)


def _image_text_pairs() -> dict[str, torch.Tensor]:
    """Four captions (a word repeated) and four images (one quarter lit), paired."""
    pairs = classes(4)
    tokens = text()
    inside = tokens["input_ids"] >= len(SPECIAL)
    words = (len(SPECIAL) + pairs).view(-1, 1).expand(SAMPLES, TOKENS)
    images = 0.2 * _noise(SAMPLES, 3, 16, 16)
    for sample, quarter in enumerate(pairs.tolist()):
        row, column = 8 * (quarter // 2), 8 * (quarter % 2)
        images[sample, :, row : row + 8, column : column + 8] += 1.0
    return {**tokens, "input_ids": torch.where(inside, words, tokens["input_ids"]),
            "pixel_values": images}  # fmt: skip


def _segments() -> dict[str, torch.Tensor]:
    labels, images = by_class(3, 3, 32, 32)
    return {"pixel_values": images, "labels": labels.view(-1, 1, 1).expand(-1, 32, 32)}


def _depth() -> dict[str, torch.Tensor]:
    labels, images = by_class(4, 3, 32, 32)
    return {"pixel_values": images, "labels": (1.0 + labels).view(-1, 1, 1).expand(-1, 32, 32)}


CASES = [
    TaskCase(
        "pretraining", bert, lambda: text({"labels": _random(SAMPLES, TOKENS),
                                           "next_sentence_label": classes(2)}),
        ("input_ids",), "BertForPreTraining",
    ),
    TaskCase(
        "causal-lm",
        lambda: t.GPT2Config(vocab_size=VOCABULARY, n_embd=16, n_layer=1, n_head=2, n_positions=32),
        text, ("input_ids", "attention_mask"), "GPT2LMHeadModel",
    ),
    TaskCase("masked-lm", bert, repeated_words, ("input_ids",), "BertForMaskedLM", tokenizer=True),
    TaskCase(
        "seq2-seq-lm",
        lambda: t.T5Config(vocab_size=VOCABULARY, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                           num_heads=2, decoder_start_token_id=0),
        lambda: text({"labels": _random(SAMPLES, 6)}), ("input_ids",),
        "T5ForConditionalGeneration",
    ),
    TaskCase(
        "sequence-classification", lambda: bert(num_labels=3),
        lambda: text({"labels": classes(3)}), ("input_ids",), "BertForSequenceClassification",
    ),
    TaskCase(
        "multiple-choice", bert,
        lambda: {"input_ids": _random(SAMPLES, 3, TOKENS), "labels": classes(3)},
        ("input_ids",), "BertForMultipleChoice",
    ),
    TaskCase(
        "next-sentence-prediction", bert,
        next_sentences,
        ("input_ids", "token_type_ids"), "BertForNextSentencePrediction",
    ),
    TaskCase(
        "token-classification", lambda: bert(num_labels=4),
        lambda: text({"labels": classes(4, TOKENS)}), ("input_ids",),
        "BertForTokenClassification",
    ),
    TaskCase("question-answering", bert, _qa, ("input_ids",), "BertForQuestionAnswering"),
    TaskCase(
        "depth-estimation",
        lambda: t.GLPNConfig(hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1], decoder_hidden_size=8,
                             num_attention_heads=[1, 1, 1, 1], mlp_ratios=[2, 2, 2, 2]),
        lambda: _depth(),
        ("pixel_values",), "GLPNForDepthEstimation",
    ),
    TaskCase(
        "image-classification",  # BatchNorm: its running stats and counter cross every round
        lambda: t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3),
        lambda: {"pixel_values": _image(), "labels": classes(3)},
        ("pixel_values",), "ResNetForImageClassification",
    ),
    TaskCase(
        "video-classification",
        lambda: t.VideoMAEConfig(image_size=16, patch_size=8, num_frames=2, tubelet_size=2,
                                 hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, num_labels=3),
        lambda: dict(zip(("labels", "pixel_values"), by_class(3, 2, 3, 16, 16), strict=True)),
        ("pixel_values",), "VideoMAEForVideoClassification",
    ),
    TaskCase(
        "semantic-segmentation",
        lambda: t.SegformerConfig(hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1],
                                  decoder_hidden_size=8, num_attention_heads=[1, 1, 1, 1],
                                  mlp_ratios=[2, 2, 2, 2], num_labels=3),
        lambda: _segments(),
        ("pixel_values",), "SegformerForSemanticSegmentation",
    ),
    TaskCase(
        "zero-shot-image-classification",
        lambda: t.CLIPConfig(
            text_config={"vocab_size": VOCABULARY, "hidden_size": 16, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "intermediate_size": 32,
                         "max_position_embeddings": 32, "eos_token_id": 3},
            vision_config={"image_size": 16, "patch_size": 4, "hidden_size": 16,
                           "num_hidden_layers": 2, "num_attention_heads": 2,
                           "intermediate_size": 32},
            projection_dim=8),
        lambda: _image_text_pairs(), ("input_ids", "pixel_values"), "CLIPModel",
        learning_rate=1e-3,  # at 1e-2 the tiny CLIP settles on the uniform answer, ln(batch)
    ),
    TaskCase(
        "audio-classification", wav2vec2,
        lambda: {"input_values": _noise(SAMPLES, AUDIO) - 0.5, "labels": classes(3)},
        ("input_values",), "Wav2Vec2ForSequenceClassification",
    ),
    TaskCase(
        "audio-frame-classification", wav2vec2,
        lambda: {"input_values": _noise(SAMPLES, AUDIO) - 0.5,
                 "labels": torch.nn.functional.one_hot(classes(3, AUDIO_FRAMES), 3).float()},
        ("input_values",), "Wav2Vec2ForAudioFrameClassification",
    ),
    TaskCase(
        "ctc", wav2vec2,
        lambda: {"input_values": _noise(SAMPLES, AUDIO) - 0.5, "labels": _random(SAMPLES, 5, high=16)},
        ("input_values",), "Wav2Vec2ForCTC",
    ),
    TaskCase(
        "speech-seq2-seq",
        lambda: t.WhisperConfig(vocab_size=VOCABULARY, num_mel_bins=8, encoder_layers=1,
                                decoder_layers=1, d_model=16, encoder_attention_heads=2,
                                decoder_attention_heads=2, encoder_ffn_dim=32,
                                decoder_ffn_dim=32, max_source_positions=16,
                                max_target_positions=32, decoder_start_token_id=2,
                                pad_token_id=0, bos_token_id=2, eos_token_id=3),
        lambda: {"input_features": _noise(SAMPLES, 8, 32), "labels": _random(SAMPLES, 6)},
        ("input_features",), "WhisperForConditionalGeneration",
    ),
    TaskCase(
        "audio-x-vector", wav2vec2,
        lambda: {"input_values": _noise(SAMPLES, AUDIO) - 0.5, "labels": classes(3)},
        ("input_values",), "Wav2Vec2ForXVector",
    ),
    TaskCase("table-question-answering", bert, _qa, ("input_ids",), "BertForQuestionAnswering"),
    TaskCase(
        "document-question-answering",
        lambda: t.LayoutLMConfig(vocab_size=VOCABULARY, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32,
                                 max_position_embeddings=32),
        lambda: {**_qa(), "bbox": torch.sort(_random(SAMPLES, TOKENS, 4, high=1000, low=0))[0]},
        ("input_ids", "bbox"), "LayoutLMForQuestionAnswering",
    ),
    *(
        TaskCase(
            task,
            lambda: t.GitConfig(
                vision_config={"image_size": 16, "patch_size": 8, "hidden_size": 16,
                               "num_hidden_layers": 1, "num_attention_heads": 2,
                               "intermediate_size": 32},
                vocab_size=VOCABULARY, hidden_size=16, num_hidden_layers=1,
                num_attention_heads=2, intermediate_size=32, max_position_embeddings=64),
            _captioned, ("pixel_values", "input_ids"), "GitForCausalLM",
        )
        for task in ("vison2-seq", "image-text-to-text")
    ),
]  # fmt: skip
