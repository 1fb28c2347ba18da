"""The job spec (JOB_JSON) as the Hypha worker sends it: accepted exactly when Hypha's Rust
types accept it, and refused beyond that only where it cannot train.

One declaration, two steps. The models below restate Hypha's `JobSpec` (crates/messages)
type by type; `serde_json` and `serde` read the text as serde_json and serde do with it
(serde.serde_type derives serde's reading from the models' annotations): that decides
accept or refuse. The same models then give the executor typed access and, by their
constraints, refuse the few jobs serde accepts but no executor could train, each listed in
the README's "Jobs refused beyond serde". Pure pydantic: the host shim imports this module,
so it must never import torch.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import (
    EXIT_OK,
    JobSpecError,
    JsonError,
    UntrainableJobError,
)
from hypha.accelerate_executor.serde import (
    PEER_ID,
    UUID,
    Integer,
    TryFrom,
    struct,
    tagged,
)
from hypha.accelerate_executor.serde_json import read_struct
from hypha.accelerate_executor.tasks import refusal

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
# the constraints and validators what the executor refuses beyond serde (README: "Jobs
# refused beyond serde"). Fields stand in upstream's declaration order, which serde reads
# arrays in, and a new field is one line here.


class JobModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


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


class DatasetSlice(JobModel):
    dataset: str
    index: Annotated[int, Integer("u64")]


class PeersReference(JobModel):
    type: Literal["peers"]
    peers: list[PeerId]
    strategy: Annotated[Strategy, tagged(Strategy)]
    resource: DatasetSlice | None = None


class SchedulerReference(JobModel):
    type: Literal["scheduler"]
    peer: PeerId
    dataset: str


# Upstream's Reference in its variant order, which serde also takes a tag's index in.
REFERENCE = tagged(UriReference, HuggingFaceReference, PeersReference, SchedulerReference)
Reference = Annotated[
    UriReference | HuggingFaceReference | PeersReference | SchedulerReference,
    Field(discriminator="type"),
]


def _send_problem(reference: dict[str, Any]) -> str | None:
    return None if reference["type"] == "peers" else "Send can only be created from Peers"


def _receive_problem(reference: dict[str, Any]) -> str | None:
    if reference["type"] != "peers":
        return "Receive can only be created from Peers"
    return None if reference["strategy"]["type"] == "All" else "Receive requires strategy All"


# serde reads every Reference; the bridge fetches uri, huggingface and scheduler references
# only, and a model comes from the first two.
ArtifactReference = Annotated[
    UriReference | HuggingFaceReference, Field(discriminator="type"), REFERENCE
]
DataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference,
    Field(discriminator="type"),
    REFERENCE,
]
# Upstream's Send and Receive: a Reference, then a try_from check.
SendReference = Annotated[PeersReference, TryFrom(REFERENCE, _send_problem)]
ReceiveReference = Annotated[PeersReference, TryFrom(REFERENCE, _receive_problem)]
# A model with no inputs, or a processor given none, cannot run.
InputNames = Annotated[list[str], Field(alias="input-names", min_length=1)]


class ModelSpec(JobModel):
    task: ModelTask
    artifact: ArtifactReference
    input_names: InputNames

    @field_validator("task")
    @classmethod
    def _trainable(cls, task: str) -> str:
        if reason := refusal(task):  # tasks.py: the task table
            raise ValueError(reason)
        return task


class PreprocessorSpec(JobModel):
    task: PreprocessorTask
    artifact: ArtifactReference
    input_names: InputNames


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


class TrainConfig(JobModel):
    model: ModelSpec
    data: DataReference
    updates: SendReference
    results: ReceiveReference
    optimizer: OptimizerSpec
    # A batch of nothing trains nothing.
    batch_size: Annotated[int, Integer("u32"), Field(gt=0)]
    preprocessor: PreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class Descriptor(JobModel):
    name: str


class ExecutorSpec(JobModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: TrainConfig


# An aggregate job, declared for serde's sake: the worker's own parameter server runs it.


class AggregateOptimizer(JobModel):
    learning_rate: float = Field(alias="learning-rate")
    momentum: float


class AggregateConfig(JobModel):
    updates: ReceiveReference
    results: SendReference
    optimizer: AggregateOptimizer


class AggregateExecutorSpec(JobModel):
    class_: Literal["aggregate"] = Field(alias="class")
    descriptor: Descriptor
    config: AggregateConfig


class Job(JobModel):
    job_id: Annotated[str, UUID]
    # Read straight from serde_json, not from a buffered enclosing enum: its tag is a string.
    executor: Annotated[ExecutorSpec, tagged(ExecutorSpec, AggregateExecutorSpec, index_tags=False)]

    @property
    def config(self) -> TrainConfig:
        return self.executor.config


JOB_SPEC = struct(Job)


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


def parse_job_bytes(data: bytes) -> Job:
    """Raises JobSpecError (UntrainableJobError for a job that serde accepts) with one line
    naming the field and the problem. The message never quotes the input's strings: they
    may hold a token."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobSpecError(f"job is not valid UTF-8 (byte {exc.start})") from None
    try:
        decoded = JOB_SPEC.decode(read_struct(text, frozenset(JOB_SPEC.fields)), ())
    except JsonError as exc:
        raise JobSpecError(f"job is not valid JSON: {exc}") from None
    if decoded["executor"]["class"] == "aggregate":
        raise UntrainableJobError(
            "executor.class: 'aggregate' jobs belong to the worker's built-in parameter "
            "server, this executor only runs 'train'"
        )
    try:
        return Job.model_validate(decoded)
    except ValidationError as exc:
        raise UntrainableJobError(f"cannot train: {_first_error(exc)}") from None


def parse_job(source: str) -> Job:
    """Parses JOB_JSON, or `@path` naming a file that holds it."""
    return parse_job_bytes(job_bytes(source))


def json_schema() -> dict[str, Any]:
    return Job.model_json_schema(by_alias=True)


def main(argv: list[str]) -> int:
    """`hypha-accelerate schema`: prints the job spec's JSON Schema."""

    def body() -> int:
        OneLineArgumentParser(prog="hypha-accelerate schema").parse_args(argv)
        print(json.dumps(json_schema(), indent=2))
        return EXIT_OK

    return run_main("hypha-accelerate schema", body)
