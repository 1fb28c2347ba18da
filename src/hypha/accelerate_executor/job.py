"""The job spec (JOB_JSON) as the Hypha worker sends it, parsed wire-exactly.

Spelling follows the wire: kebab-case inside `model`, `preprocessor` and `optimizer`,
snake_case elsewhere. Integers are strict (`batch_size: 8.0` is refused, as the Rust side
refuses it). Unknown keys are ignored, as serde does by default. Pure pydantic: the host
shim imports this module, so it must never import torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from hypha.accelerate_executor.errors import JobSpecError

ModelTask = Literal[
    "auto", "pretraining", "causal-lm", "masked-lm", "mask-generation", "seq2-seq-lm",
    "sequence-classification", "multiple-choice", "next-sentence-prediction",
    "token-classification", "question-answering", "text-encoding", "depth-estimation",
    "image-classification", "video-classification", "keypoint-detection", "keypoint-matching",
    "object-detection", "image-segmentation", "image-to-image", "semantic-segmentation",
    "instance-segmentation", "universal-segmentation", "zero-shot-image-classification",
    "zero-shot-object-detection", "audio-classification", "audio-frame-classification", "ctc",
    "speech-seq2-seq", "audio-x-vector", "text-to-spectrogram", "text-to-waveform",
    "audio-tokenization", "table-question-answering", "document-question-answering",
    "vison2-seq", "vision2-seq", "image-text-to-text", "time-series-prediction",
]  # fmt: skip
PreprocessorTask = Literal["tokenizer", "feature", "image", "video", "auto"]


class WireModel(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")


# References (protocol.md section 3), tagged by `type`.


class UriReference(WireModel):
    type: Literal["uri"]
    value: StrictStr

    @field_validator("value")
    @classmethod
    def _http_only(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class HuggingFaceReference(WireModel):
    type: Literal["huggingface"]
    repository: Annotated[StrictStr, Field(min_length=1)]
    revision: StrictStr | None = None
    filenames: Annotated[list[StrictStr], Field(min_length=1)]
    # Kept out of repr so a token never reaches a log line by accident.
    token: StrictStr | None = Field(default=None, repr=False)


class Strategy(WireModel):
    type: Literal["All", "One", "Random"]


class DatasetSlice(WireModel):
    dataset: StrictStr
    index: StrictInt


class PeersReference(WireModel):
    type: Literal["peers"]
    peers: list[StrictStr]
    strategy: Strategy
    resource: DatasetSlice | None = None


class SchedulerReference(WireModel):
    type: Literal["scheduler"]
    peer: StrictStr
    dataset: StrictStr


Reference = Annotated[
    UriReference | HuggingFaceReference | PeersReference | SchedulerReference,
    Field(discriminator="type"),
]
ArtifactReference = Annotated[UriReference | HuggingFaceReference, Field(discriminator="type")]
DataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference, Field(discriminator="type")
]

# The executor's config.


class ModelSpec(WireModel):
    task: ModelTask
    artifact: ArtifactReference
    input_names: list[StrictStr] = Field(alias="input-names", min_length=1)


class PreprocessorSpec(WireModel):
    task: PreprocessorTask
    artifact: ArtifactReference
    input_names: list[StrictStr] = Field(alias="input-names", min_length=1)


class OptimizerSpec(WireModel):
    learning_rate: Annotated[StrictFloat | StrictInt, Field(gt=0)] = Field(alias="learning-rate")
    betas: tuple[StrictFloat | StrictInt, StrictFloat | StrictInt] | None = None
    epsilon: StrictFloat | StrictInt | None = None


NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class CosineWithWarmup(WireModel):
    type: Literal["cosine-with-warmup"]
    warmup_steps: NonNegativeInt
    training_steps: Annotated[StrictInt, Field(gt=0)]


class LinearWithWarmup(WireModel):
    type: Literal["linear-with-warmup"]
    warmup_steps: NonNegativeInt
    training_steps: Annotated[StrictInt, Field(gt=0)]


class WarmupStableDecay(WireModel):
    type: Literal["wsd"]
    warmup_steps: NonNegativeInt
    decay_steps: NonNegativeInt


LrScheduler = Annotated[
    CosineWithWarmup | LinearWithWarmup | WarmupStableDecay, Field(discriminator="type")
]


class ResultsReference(PeersReference):
    """Where updates come from: the bridge only streams with strategy All."""

    @field_validator("strategy")
    @classmethod
    def _all_only(cls, strategy: Strategy) -> Strategy:
        if strategy.type != "All":
            raise ValueError(f"results must use strategy All, not {strategy.type}")
        return strategy


class TrainConfig(WireModel):
    model: ModelSpec
    data: DataReference
    updates: PeersReference
    results: ResultsReference
    optimizer: OptimizerSpec
    batch_size: Annotated[StrictInt, Field(gt=0)]
    preprocessor: PreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class Descriptor(WireModel):
    name: StrictStr


class ExecutorSpec(WireModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: TrainConfig

    @field_validator("class_", mode="before")
    @classmethod
    def _refuse_aggregate(cls, value: Any) -> Any:
        if value == "aggregate":
            raise ValueError(
                "'aggregate' jobs belong to the worker's built-in parameter server, "
                "this executor only runs 'train'"
            )
        return value


class Job(WireModel):
    job_id: Annotated[StrictStr, Field(min_length=1)]
    executor: ExecutorSpec

    @property
    def config(self) -> TrainConfig:
        return self.executor.config


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _first_error(error: ValidationError) -> str:
    detail = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in detail["loc"]) or "job"
    return f"{where}: {detail['msg'].removeprefix('Value error, ')}"


def parse_job(text_or_at_path: str) -> Job:
    """Parses JOB_JSON, or `@path` naming a file that holds it.

    Raises JobSpecError with one line naming the field and the problem. The message never
    quotes input values: they may hold a token.
    """
    text = text_or_at_path
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise JobSpecError(f"cannot read job file {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise JobSpecError(f"job is not valid JSON: {exc}") from None
    try:
        return Job.model_validate(raw)
    except ValidationError as exc:
        raise JobSpecError(_first_error(exc)) from None


def json_schema() -> dict[str, Any]:
    return Job.model_json_schema(by_alias=True)


def main(argv: list[str]) -> int:
    """`hypha-accelerate schema`: prints the job spec's JSON Schema."""
    if argv:
        print("usage: hypha-accelerate schema", file=sys.stderr)
        return 2
    print(json.dumps(json_schema(), indent=2))
    return 0
