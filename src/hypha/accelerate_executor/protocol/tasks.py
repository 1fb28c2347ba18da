"""Every model task a Hypha job can name: how it trains, or why it cannot.

A task trains when its transformers Auto class computes a loss from tensors a slice file can
hold (one row per sample, every row the same shape). Its labels come one of four ways:

- `slices`: the slice holds them, under the names the model's forward takes;
- `causal`: `input_ids` with padding (attention_mask 0) at -100, unless the slice holds `labels`;
- `masked`: BERT's masking of `input_ids`, unless the slice holds `labels` (inputs.py);
- `contrastive`: the batch's own pairs are the targets; the model is asked for its loss.

The other tasks are refused when the job is parsed, before anything is fetched: the shim
imports this module through job.py, so it must never import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LabelRule = Literal["slices", "causal", "masked", "contrastive"]


@dataclass(frozen=True)
class Trains:
    auto_class: str
    slices: str  # what a slice holds, for docs/jobs.md and the refusal of a bad slice
    labels: LabelRule = "slices"
    # Tensors the loss is computed from: taken from a slice that holds them, whether or not
    # the job's input-names list them.
    label_names: tuple[str, ...] = ("labels",)


@dataclass(frozen=True)
class Refused:
    auto_class: str
    reason: str


Task = Trains | Refused

_TOKENS = "input_ids, attention_mask"
_NO_LOSS = "has no loss to train"
_LISTS = "its labels are per-sample lists of different lengths, which a slice file cannot hold"

# Keyed by serde's kebab-case of upstream's ModelType (job.py's ModelTask), in its order.
TASKS: dict[str, Task] = {
    "auto": Refused("AutoModel", f"a bare model without a head {_NO_LOSS}"),
    "pretraining": Trains(
        "AutoModelForPreTraining",
        f"{_TOKENS}, and every label the model's pretraining loss takes "
        "(BERT: labels, next_sentence_label)",
        label_names=("labels", "next_sentence_label", "sentence_order_label"),
    ),
    "causal-lm": Trains(
        "AutoModelForCausalLM", f"{_TOKENS}; labels optional (default: input_ids)", "causal"
    ),
    "masked-lm": Trains(
        "AutoModelForMaskedLM",
        f"{_TOKENS}; labels optional (default: 15% of the tokens masked, BERT's rule)",
        "masked",
    ),
    "mask-generation": Refused("AutoModelForMaskGeneration", f"SAM {_NO_LOSS}"),
    "seq2-seq-lm": Trains("AutoModelForSeq2SeqLM", f"{_TOKENS}, labels (the target tokens)"),
    "sequence-classification": Trains(
        "AutoModelForSequenceClassification", f"{_TOKENS}, labels (one class per sample)"
    ),
    "multiple-choice": Trains(
        "AutoModelForMultipleChoice",
        "input_ids, attention_mask as [choices, tokens] per sample, labels (the right choice)",
    ),
    "next-sentence-prediction": Trains(
        "AutoModelForNextSentencePrediction",
        f"{_TOKENS}, token_type_ids, labels (0: B follows A, 1: it does not)",
    ),
    "token-classification": Trains(
        "AutoModelForTokenClassification", f"{_TOKENS}, labels (a class per token, -100 ignored)"
    ),
    "question-answering": Trains(
        "AutoModelForQuestionAnswering",
        f"{_TOKENS}, start_positions, end_positions",
        label_names=("start_positions", "end_positions"),
    ),
    "text-encoding": Refused("AutoModelForTextEncoding", f"an encoder without a head {_NO_LOSS}"),
    "depth-estimation": Trains(
        "AutoModelForDepthEstimation",
        "pixel_values, labels (a depth map per image; GLPN and ZoeDepth compute a loss, DPT "
        "and Depth Anything do not)",
    ),
    "image-classification": Trains(
        "AutoModelForImageClassification", "pixel_values, labels (one class per image)"
    ),
    "video-classification": Trains(
        "AutoModelForVideoClassification",
        "pixel_values as [frames, channels, height, width] per sample, labels",
    ),
    "keypoint-detection": Refused("AutoModelForKeypointDetection", f"SuperPoint {_NO_LOSS}"),
    "keypoint-matching": Refused(
        "AutoModelForKeypointMatching", "SuperGlue and LightGlue have no loss to train"
    ),
    "object-detection": Refused(
        "AutoModelForObjectDetection", f"{_LISTS} (a list of boxes and classes per image)"
    ),
    "image-segmentation": Refused(
        "AutoModelForImageSegmentation", f"{_LISTS} (a list of masks and classes per image)"
    ),
    "image-to-image": Refused("AutoModelForImageToImage", f"Swin2SR {_NO_LOSS}"),
    "semantic-segmentation": Trains(
        "AutoModelForSemanticSegmentation", "pixel_values, labels (a class per pixel)"
    ),
    "instance-segmentation": Refused(
        "AutoModelForInstanceSegmentation", f"{_LISTS} (mask_labels and class_labels)"
    ),
    "universal-segmentation": Refused(
        "AutoModelForUniversalSegmentation", f"{_LISTS} (mask_labels and class_labels)"
    ),
    "zero-shot-image-classification": Trains(
        "AutoModelForZeroShotImageClassification",
        "input_ids, attention_mask, pixel_values: matching image-text pairs",
        "contrastive",
        label_names=(),
    ),
    "zero-shot-object-detection": Refused(
        "AutoModelForZeroShotObjectDetection", f"{_LISTS} (boxes per image), or OWL-ViT {_NO_LOSS}"
    ),
    "audio-classification": Trains(
        "AutoModelForAudioClassification", "input_values (the waveform), labels"
    ),
    "audio-frame-classification": Trains(
        "AutoModelForAudioFrameClassification",
        "input_values, labels (one-hot [frames, classes] per sample)",
    ),
    "ctc": Trains("AutoModelForCTC", "input_values, labels (the transcript's ids, -100 padded)"),
    "speech-seq2-seq": Trains(
        "AutoModelForSpeechSeq2Seq", "input_features (Whisper's log-mel), labels (target tokens)"
    ),
    "audio-x-vector": Trains("AutoModelForAudioXVector", "input_values, labels (the speaker)"),
    "text-to-spectrogram": Refused(
        "AutoModelForTextToSpectrogram",
        "SpeechT5's loss needs its spectrogram labels cut to its reduction factor and "
        "FastSpeech2's needs duration, pitch and energy lists; not proven to train here",
    ),
    "text-to-waveform": Refused(
        "AutoModelForTextToWaveform",
        "VITS and Bark have no loss to train; not proven to train here",
    ),
    "audio-tokenization": Refused("AutoModelForAudioTokenization", f"a codec {_NO_LOSS}"),
    # Upstream's executor loads this task with AutoModelForQuestionAnswering, and so do we.
    "table-question-answering": Trains(
        "AutoModelForQuestionAnswering",
        f"{_TOKENS}, start_positions, end_positions",
        label_names=("start_positions", "end_positions"),
    ),
    "document-question-answering": Trains(
        "AutoModelForDocumentQuestionAnswering",
        f"{_TOKENS}, bbox (LayoutLM's [tokens, 4] boxes), start_positions, end_positions",
        label_names=("start_positions", "end_positions"),
    ),
    # transformers 5 folded Vision2Seq into ImageTextToText; older releases have both.
    "vison2-seq": Trains("AutoModelForVision2Seq", f"pixel_values, {_TOKENS}, labels"),
    "image-text-to-text": Trains("AutoModelForImageTextToText", f"pixel_values, {_TOKENS}, labels"),
    "time-series-prediction": Refused(
        "AutoModelForTimeSeriesPrediction",
        "TimesFM takes its context as a list of series of different lengths",
    ),
}


def refusal(task: str) -> str | None:
    """Why a job naming `task` cannot train, in one line; None when it trains."""
    entry = TASKS[task]
    if isinstance(entry, Refused):
        return f"{task!r} ({entry.auto_class}) is refused: {entry.reason}"
    return None


def trains(task: str) -> Trains:
    entry = TASKS[task]
    assert isinstance(entry, Trains), refusal(task)
    return entry
