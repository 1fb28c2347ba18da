"""The job spec (JOB_JSON) as the Hypha worker sends it, the part both bridge generations share:
the types that stay the same, and reading a job exactly when Hypha's Rust types accept it,
refused beyond that only where it cannot train.

One declaration, two steps. Each generation's models (alpha17/job.py, actions/job.py) restate
Hypha's `JobSpec` (crates/messages) type by type, on the shared ones below; `serde_json` and
`serde` read the text as serde_json and serde do with it (serde.serde_type derives serde's
reading from the models' annotations): that decides accept or refuse. The same models then
give the executor typed access and, by their constraints, refuse the few jobs serde accepts
but no executor could train, each listed in docs/jobs.md ("the jobs refused beyond serde").
Pure pydantic: the host shim imports this package, so it must never import torch. Which
generation a job is, and reading it as either, is generation.py's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from hypha.accelerate_executor.errors import JobSpecError, JsonError, UntrainableJobError
from hypha.accelerate_executor.protocol.serde import PEER_ID, Integer
from hypha.accelerate_executor.protocol.serde_json import read_struct
from hypha.accelerate_executor.protocol.tasks import refusal

# serde's kebab-case of upstream's ModelType; `vison2-seq` (sic) is how it spells Vison2Seq,
# and "vision2-seq" is unknown to it.
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
    "vison2-seq", "image-text-to-text", "time-series-prediction",
]  # fmt: skip
PreprocessorTask = Literal["tokenizer", "feature", "image", "video", "auto"]


# Hypha's types (crates/messages/src/lib.rs), declared once: the annotations say what serde
# accepts (serde.serde_type; a SerdeType in `Annotated` where Python's type says too little),
# the constraints and validators what the executor refuses beyond serde (docs/jobs.md: "the jobs
# refused beyond serde"). Fields stand in upstream's declaration order, which serde reads
# arrays in, and a new field is one line here.


class JobModel(BaseModel):
    # By name too, so that a job can be built in Python (the stand-in's jobs): what is read
    # is serde's output, which holds the wire names only.
    model_config = ConfigDict(frozen=True, extra="ignore", validate_by_name=True)


PeerId = Annotated[str, PEER_ID]


class UriReference(JobModel):
    type: Literal["uri"]
    value: str

    @field_validator("value")
    @classmethod
    def _http_only(cls, value: str) -> str:
        # The bridge fetches http and https only.
        if not value.lower().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class HuggingFaceReference(JobModel):
    type: Literal["huggingface"]
    # The bridge needs a repository and at least one file to fetch.
    repository: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    filenames: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    # Kept out of repr so a token never reaches a log line by accident.
    token: str | None = Field(default=None, repr=False)


class Strategy(JobModel):
    type: Literal["All", "Random", "One"]


class SchedulerReference(JobModel):
    type: Literal["scheduler"]
    peer: PeerId
    dataset: str


# What the bridge fetches, whichever generation's job names it: a model or preprocessor's
# artifact (uri, huggingface) or the data (those, or the scheduler's slices).
FetchedReference = UriReference | HuggingFaceReference | SchedulerReference


def _trainable(task: str) -> str:
    if reason := refusal(task):  # tasks.py: the task table
        raise ValueError(reason)
    return task


# A model's task, refused where the task table says it cannot train.
TrainableTask = Annotated[ModelTask, AfterValidator(_trainable)]
# A model with no inputs, or a processor given none, cannot run.
InputNames = Annotated[list[str], Field(alias="input-names", min_length=1)]

# torch's AdamW refuses these, so the job would fail once its model is loaded.
Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerSpec(JobModel):
    learning_rate: float = Field(alias="learning-rate", ge=0)
    betas: tuple[Beta, Beta] | None = None
    epsilon: Annotated[float, Field(ge=0)] | None = None


Steps = Annotated[int, Integer("i32")]


class CosineWithWarmup(JobModel):
    type: Literal["cosine-with-warmup"]
    warmup_steps: Steps
    training_steps: Steps


class LinearWithWarmup(JobModel):
    type: Literal["linear-with-warmup"]
    warmup_steps: Steps
    training_steps: Steps


class WarmupStableDecay(JobModel):
    type: Literal["wsd"]
    warmup_steps: Steps
    decay_steps: Steps


LrScheduler = Annotated[
    CosineWithWarmup | LinearWithWarmup | WarmupStableDecay, Field(discriminator="type")
]

# A batch of nothing trains nothing.
BatchSize = Annotated[int, Integer("u32"), Field(gt=0)]


class Descriptor(JobModel):
    name: str


# The aggregate executor's optimizer, declared for serde's sake: the worker's own parameter
# server runs aggregate jobs.
class AggregateOptimizer(JobModel):
    learning_rate: float = Field(alias="learning-rate")
    momentum: float


def job_bytes(source: str) -> bytes:
    """The job as the worker hands it over: the JSON itself, or `@path` of a file holding
    it. Strings from argv or the environment carry bytes that are not UTF-8 as surrogate
    escapes, which stay invalid here."""
    if not source.startswith("@"):
        return source.encode("utf-8", "surrogatepass")
    try:
        with open(source[1:], "rb") as file:
            return file.read()
    except OSError as exc:
        raise JobSpecError(f"cannot read job file {source[1:]!r}: {exc.strerror}") from None


def _first_error(error: ValidationError) -> str:
    detail = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in detail["loc"]) or "job"
    return f"{where}: {detail['msg'].removeprefix('Value error, ')}"


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobSpecError(f"job is not valid UTF-8 (byte {exc.start})") from None


def _serde(text: str, spec: Any) -> dict[str, Any]:
    """What serde makes of the text as `spec`; JobSpecError with serde's reason if it refuses."""
    try:
        decoded: dict[str, Any] = spec.decode(read_struct(text, frozenset(spec.fields)), ())
    except JsonError as exc:
        raise JobSpecError(f"job is not valid JSON: {exc}") from None
    return decoded


Model = TypeVar("Model", bound=JobModel)

# The executor classes a train executor refuses, with why, once serde has read them.
OTHER_CLASSES = {
    "aggregate": "'aggregate' jobs belong to the worker's built-in parameter server",
    "gymnasium": "'gymnasium' jobs belong to an RL environment executor",
    "rl-trainer": "'rl-trainer' jobs belong to an RL trainer executor",
}


def read_job(data: bytes, spec: Any, model: type[Model]) -> Model:
    """The job as serde reads it as `spec`, then as `model`. Raises JobSpecError
    (UntrainableJobError for a job that serde accepts) with one line naming the field and the
    problem. The message never quotes the input's strings: they may hold a token."""
    decoded = _serde(_text(data), spec)
    cls = decoded["executor"]["class"]
    if cls in OTHER_CLASSES:
        raise UntrainableJobError(
            f"executor.class: {OTHER_CLASSES[cls]}, this executor only runs 'train'"
        )
    try:
        return model.model_validate(decoded)
    except ValidationError as exc:
        raise UntrainableJobError(f"cannot train: {_first_error(exc)}") from None
