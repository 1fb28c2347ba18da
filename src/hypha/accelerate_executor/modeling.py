"""From a job's task names to transformers classes, and loading what the bridge fetched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import transformers

from hypha.accelerate_executor.errors import JobSpecError, RemoteCodeRefused

# Wire task -> the transformers Auto class of the same name (protocol.md section 4).
AUTO_MODEL_CLASSES = {
    "auto": "AutoModel",
    "pretraining": "AutoModelForPreTraining",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "mask-generation": "AutoModelForMaskGeneration",
    "seq2-seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "multiple-choice": "AutoModelForMultipleChoice",
    "next-sentence-prediction": "AutoModelForNextSentencePrediction",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "text-encoding": "AutoModelForTextEncoding",
    "depth-estimation": "AutoModelForDepthEstimation",
    "image-classification": "AutoModelForImageClassification",
    "video-classification": "AutoModelForVideoClassification",
    "keypoint-detection": "AutoModelForKeypointDetection",
    "keypoint-matching": "AutoModelForKeypointMatching",
    "object-detection": "AutoModelForObjectDetection",
    "image-segmentation": "AutoModelForImageSegmentation",
    "image-to-image": "AutoModelForImageToImage",
    "semantic-segmentation": "AutoModelForSemanticSegmentation",
    "instance-segmentation": "AutoModelForInstanceSegmentation",
    "universal-segmentation": "AutoModelForUniversalSegmentation",
    "zero-shot-image-classification": "AutoModelForZeroShotImageClassification",
    "zero-shot-object-detection": "AutoModelForZeroShotObjectDetection",
    "audio-classification": "AutoModelForAudioClassification",
    "audio-frame-classification": "AutoModelForAudioFrameClassification",
    "ctc": "AutoModelForCTC",
    "speech-seq2-seq": "AutoModelForSpeechSeq2Seq",
    "audio-x-vector": "AutoModelForAudioXVector",
    "text-to-spectrogram": "AutoModelForTextToSpectrogram",
    "text-to-waveform": "AutoModelForTextToWaveform",
    "audio-tokenization": "AutoModelForAudioTokenization",
    "table-question-answering": "AutoModelForQuestionAnswering",
    "document-question-answering": "AutoModelForDocumentQuestionAnswering",
    # transformers 5 folded Vision2Seq into ImageTextToText; older releases have both.
    "vison2-seq": "AutoModelForVision2Seq",
    "image-text-to-text": "AutoModelForImageTextToText",
    "time-series-prediction": "AutoModelForTimeSeriesPrediction",
}
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


def trust_remote_code() -> bool:
    """Remote code in model repositories runs only when the operator opts in."""
    return os.environ.get("HYPHA_TRUST_REMOTE_CODE", "") in ("1", "true", "yes")


def _refuse_untrusted_code(folder: Path, config_file: str, what: str) -> None:
    try:
        ships_code = "auto_map" in json.loads((folder / config_file).read_text())
    except (OSError, ValueError, TypeError):
        return  # transformers will say what is wrong with the file
    if ships_code and not trust_remote_code():
        raise RemoteCodeRefused(
            f"the {what} ships its own Python code ({config_file} has an auto_map); "
            "set HYPHA_TRUST_REMOTE_CODE=1 to allow it"
        )


def load_model(task: str, folder: Path) -> torch.nn.Module:
    cls = _transformers_class(AUTO_MODEL_CLASSES[task], f"model task {task!r}")
    _refuse_untrusted_code(folder, "config.json", "model")
    transformers.utils.logging.disable_progress_bar()  # a bar per load is noise in a worker's log
    model: torch.nn.Module = cls.from_pretrained(
        folder, trust_remote_code=trust_remote_code(), dtype=torch.float32
    )
    return model


def load_preprocessor(task: str, folder: Path) -> Any:
    cls = _transformers_class(_PREPROCESSOR_CLASSES[task], f"preprocessor task {task!r}")
    for config_file in ("preprocessor_config.json", "tokenizer_config.json"):
        _refuse_untrusted_code(folder, config_file, "preprocessor")
    return cls.from_pretrained(folder, trust_remote_code=trust_remote_code())
